"""eagle3web.db: a statement built once answers as the queryset built each time would, whatever the
values, and a rule that loses or repeats a value fails at compile time instead of running with a wrong one."""
import pytest
from django.contrib.auth import get_user_model
from django.db.models import Q

from eagle3web.db import compile_query, stand_in

pytestmark = pytest.mark.django_db


def test_each_call_reads_the_row_its_values_name_as_the_orm_would():
    users = get_user_model().objects
    alice = users.create_user("alice", is_active=True)
    bob = users.create_user("bob", is_active=False)
    query = compile_query(users.filter(pk=stand_in(0), is_active=True).values_list("username"), user=stand_in(0))
    # The constant of the rule (is_active=True) stays; only the id changes between calls.
    assert query.fetch_one(user=alice.pk) == ("alice",)
    assert query.fetch_one(user=bob.pk) is None
    assert query.fetch_one(user=bob.pk) == users.filter(pk=bob.pk, is_active=True).values_list("username").first()


def test_values_go_to_their_own_places_whatever_the_order_they_are_given_in():
    users = get_user_model().objects
    a, b = users.create_user("a"), users.create_user("b")
    query = compile_query(users.filter(pk__in=[stand_in(0), stand_in(1)]).exclude(pk=stand_in(2))
                          .order_by("username").values_list("username"), first=stand_in(0), second=stand_in(1),
                          left_out=stand_in(2))
    assert query.fetch_one(left_out=a.pk, second=b.pk, first=a.pk) == ("b",)
    assert query.fetch_one(first=a.pk, second=b.pk, left_out=b.pk) == ("a",)


def test_a_value_the_rule_drops_or_repeats_fails_when_compiled():
    users = get_user_model().objects
    with pytest.raises(AssertionError, match="user is in the compiled statement 0 times"):
        compile_query(users.filter(pk=1).values_list("pk"), user=stand_in(0))
    twice = users.filter(Q(pk=stand_in(0)) | Q(last_login__isnull=True, pk=stand_in(0))).values_list("pk")
    with pytest.raises(AssertionError, match="user is in the compiled statement 2 times"):
        compile_query(twice, user=stand_in(0))


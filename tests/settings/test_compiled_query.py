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



def test_fetch_values_gives_the_rows_values_would_converted_and_named_in_its_order():
    """A JSON column parsed, a subquery's value converted to its field's type, and the names in the order values()
    was given them (not the model's): the same dicts as the queryset, for any ids."""
    from django.db.models import OuterRef, Subquery

    from runs.data.models import TargetModel

    users = get_user_model().objects
    alice, bob = users.create_user("alice"), users.create_user("bob")
    for n in range(3):
        TargetModel.objects.create(name=f"target ✓ {n}", path=f"/data/{n}", architecture="LlamaForCausalLM",
                                   model_type="llama", num_layers=4, hidden_size=64, vocab_size=512,
                                   config={"rows": n, "note": "naïve\u2028line"})
    joined = Subquery(users.filter(pk=OuterRef("pk")).values("date_joined")[:1])
    rows = users.annotate(joined=joined).values("username", "joined", "pk")
    query = compile_query(rows.filter(pk__in=[stand_in(0), stand_in(1)]), a=stand_in(0), b=stand_in(1))
    assert query.columns == ("username", "joined", "pk")
    assert query.fetch_values(a=alice.pk, b=bob.pk) == list(rows.filter(pk__in=[alice.pk, bob.pk]))
    assert query.fetch_values(a=bob.pk, b=-5) == [{"username": "bob", "joined": bob.date_joined, "pk": bob.pk}]
    configs = TargetModel.objects.order_by("pk").values("config", "name")
    compiled = compile_query(configs.filter(pk__gt=stand_in(0)), after=stand_in(0))
    got = compiled.fetch_values(after=0)
    assert got == list(configs) and got[2]["config"] == {"rows": 2, "note": "naïve\u2028line"}


def test_fetch_values_refuses_a_query_that_is_not_of_values():
    users = get_user_model().objects
    query = compile_query(users.filter(pk=stand_in(0)).values_list("username"), user=stand_in(0))
    with pytest.raises(TypeError, match="values"):
        query.fetch_values(user=1)


def test_a_compiled_statement_is_prepared_on_postgresql_unless_the_setting_says_not(settings):
    """Planned once a connection (pg_prepared_statements lists it after its first run), answering alike either way;
    DATABASE_PREPARED_STATEMENTS=0 (behind a pooler that moves statements between connections) prepares nothing."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    users = get_user_model().objects
    alice = users.create_user("alice-prepared")
    query = compile_query(users.filter(pk=stand_in(0)).values("username", "pk"), user=stand_in(0))

    def prepared() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            return [row[0] for row in cursor.fetchall() if 'FROM "auth_user"' in row[0] and "username" in row[0]]

    settings.DATABASE_PREPARED_STATEMENTS = False
    assert query.fetch_values(user=alice.pk) == [{"username": "alice-prepared", "pk": alice.pk}] and prepared() == []
    settings.DATABASE_PREPARED_STATEMENTS = True
    assert query.fetch_values(user=alice.pk) == [{"username": "alice-prepared", "pk": alice.pk}]
    assert query.fetch_one(user=alice.pk) == ("alice-prepared", alice.pk)
    assert len(prepared()) == 1

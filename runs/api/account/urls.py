from django.urls import path

from runs.api.account import views as account_views

urlpatterns = [
    path("", account_views.account, name="account"),
    path("tokens/<int:pk>/revoke/", account_views.account_token_revoke, name="account_token_revoke"),
    path("team/", account_views.account_team, name="account_team"),
]

"""The alerts pages, under the runs app's namespace (runs/web/urls.py includes these at /alerts/)."""
from django.urls import path

from runs.alerts import views

urlpatterns = [
    path("", views.alert_list, name="alert_list"),
    path("read/", views.alert_read, name="alert_read"),
    path("rules/", views.alert_rules, name="alert_rules"),
    path("rules/<int:pk>/delete/", views.alert_rule_delete, name="alert_rule_delete"),
]

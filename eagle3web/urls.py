from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # The versioned REST API (tokens, JSON errors) and the account page where tokens are made.
    path("api/v1/", include("runs.api.urls")),
    path("account/", include("runs.api.account_urls")),
    path("", include("runs.web.urls")),
]

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from eagle3web.login_throttle import ThrottledAdminAuthenticationForm, ThrottledAuthenticationForm

# Both sign-in forms say so when the throttle (eagle3web.login_throttle) refused the attempt.
admin.site.login_form = ThrottledAdminAuthenticationForm

urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(authentication_form=ThrottledAuthenticationForm), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # The versioned REST API (tokens, JSON errors) and the account page where tokens are made.
    path("api/v1/", include("runs.api.urls")),
    path("account/", include("runs.api.account.urls")),
    path("", include("runs.web.urls")),
]
# An error no view caught answers /api/ in JSON (and the pages with Django's own page).
handler500 = "runs.api.base.server_error"

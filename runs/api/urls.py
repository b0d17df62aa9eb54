"""/api/v1/: the versioned REST API (runs.api.views_runs, runs.api.views_data) and its description."""
from django.urls import path, re_path

from runs.alerts import api as alert_api
from runs.reports import api as report_api
from runs.api import docs, views_compare, views_data, views_external, views_generations, views_projects, views_runs

app_name = "api"
urlpatterns = [
    path("runs/", views_runs.RunList.as_view(), name="run_list"),
    path("runs/<int:pk>/", views_runs.RunDetail.as_view(), name="run_detail"),
    path("runs/<int:pk>/status/", views_runs.RunStatus.as_view(), name="run_status"),
    path("runs/<int:pk>/cancel/", views_runs.RunCancel.as_view(), name="run_cancel"),
    path("runs/<int:pk>/retry/", views_runs.RunRetry.as_view(), name="run_retry"),
    path("runs/<int:pk>/tags/", views_runs.RunTags.as_view(), name="run_tags"),
    path("runs/<int:pk>/keep-cache/", views_runs.RunKeepCache.as_view(), name="run_keep_cache"),
    path("runs/<int:pk>/copy/", views_runs.RunCopy.as_view(), name="run_copy"),
    path("runs/<int:pk>/checkpoints/", views_external.RunCheckpoints.as_view(), name="run_checkpoints"),
    path("runs/<int:pk>/end/", views_external.RunEnd.as_view(), name="run_end"),
    path("runs/<int:pk>/stages/", views_runs.RunStages.as_view(), name="run_stages"),
    path("runs/<int:pk>/attempts/", views_runs.RunAttempts.as_view(), name="run_attempts"),
    path("runs/<int:pk>/metrics/", views_runs.RunMetrics.as_view(), name="run_metrics"),
    path("runs/<int:pk>/metrics/export/", views_runs.RunMetricsExport.as_view(), name="run_metrics_export"),
    path("checkpoints/<int:pk>/", views_data.CheckpointDetail.as_view(), name="checkpoint_detail"),
    path("checkpoints/<int:pk>/evaluate/", views_data.CheckpointEvaluate.as_view(), name="checkpoint_evaluate"),
    path("checkpoints/<int:pk>/export/", views_data.CheckpointExport.as_view(), name="checkpoint_export"),
    path("checkpoints/<int:pk>/generations/", views_generations.CheckpointGenerations.as_view(), name="checkpoint_generations"),
    path("extractions/", views_data.ExtractionList.as_view(), name="extraction_list"),
    path("extractions/<int:pk>/", views_data.ExtractionDetail.as_view(), name="extraction_detail"),
    path("extractions/<int:pk>/verify/", views_data.ExtractionVerify.as_view(), name="extraction_verify"),
    path("datasets/", views_data.DatasetList.as_view(), name="dataset_list"),
    path("datasets/<int:pk>/", views_data.DatasetDetail.as_view(), name="dataset_detail"),
    path("datasets/<int:pk>/catalogue/", views_data.DatasetCatalogue.as_view(), name="dataset_catalogue"),
    path("datasets/<int:pk>/regenerate/", views_data.DatasetRegenerate.as_view(), name="dataset_regenerate"),
    path("compare/acceptance/", views_compare.CompareAcceptance.as_view(), name="compare_acceptance"),
    path("targets/", views_data.TargetList.as_view(), name="target_list"),
    path("projects/", views_projects.ProjectList.as_view(), name="project_list"),
    path("projects/<int:pk>/members/", views_projects.ProjectMembers.as_view(), name="project_members"),
    path("projects/<int:pk>/members/<str:username>/", views_projects.ProjectMemberDetail.as_view(), name="project_member"),
    path("saved-views/", views_projects.SavedViewList.as_view(), name="saved_view_list"),
    path("targets/inspect/", views_data.TargetInspect.as_view(), name="target_inspect"),
    path("sweeps/<int:pk>/", views_data.SweepDetail.as_view(), name="sweep_detail"),
    path("workers/", views_data.Workers.as_view(), name="workers"),
    path("me/", views_data.Me.as_view(), name="me"),
    path("reports/", report_api.ReportList.as_view(), name="report_list"),
    path("reports/<int:pk>/", report_api.ReportDetail.as_view(), name="report_detail"),
    path("alerts/", alert_api.AlertList.as_view(), name="alert_list"),
    path("alerts/read/", alert_api.AlertRead.as_view(), name="alert_read"),
    path("alert-rules/", alert_api.AlertRuleList.as_view(), name="alert_rule_list"),
    path("alert-rules/<int:pk>/", alert_api.AlertRuleDetail.as_view(), name="alert_rule_detail"),
    path("openapi.json", docs.openapi_json, name="openapi"),
    path("", docs.api_docs, name="docs"),
    # Anything else under /api/v1/ is a 404 in JSON (a script never gets the site's HTML page).
    re_path(r"^.*$", docs.not_found, name="not_found"),
]

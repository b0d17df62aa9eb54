"""The launch page's "Build the demo target again" button, shown when `make demo`'s build failed
(runs.data.demo.demo_build_failed)."""
from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from runs.pipeline.jobs import services as job_services
from runs.roles import user_can


@require_POST
def demo_build_again(request: HttpRequest) -> HttpResponse:
    # Any signed-in user: the build writes only the demo's own folder, chosen by `make demo`, not by them.
    failed, build = job_services.demo_build_again()
    if failed is None:
        messages.info(request, "No failed demo build is waiting to be built again: the demo target is built, or "
                               "a build of it is queued or running.")
    elif build is None:
        messages.info(request, f"The demo target is already built in {failed.out_dir}: nothing was queued.")
    else:
        messages.success(request, f"The demo target is being built again ({build}); this page shows how far it is.")
    # The launch page shows the build's step; a user who may not launch goes to the runs list instead.
    return redirect("runs:run_launch" if user_can(request.user, "launch") else "runs:run_list")

"""/api/v1/compare/acceptance/: compare's acceptance per draft position against one baseline run
(runs.tracking.comparison.acceptance_side_by_side), what the compare page's baseline select asks."""
from __future__ import annotations

from rest_framework.response import Response

from runs.api.base import ApiView
from runs.tracking import comparison


class CompareAcceptance(ApiView):
    query_params = {"GET": [
        ("ids", "string", "the runs compared, comma-separated run ids (2 to 50), in the order shown"),
        ("baseline", "integer", "the baseline run, one of those measured (default: the first measured)")]}
    responses = {"GET": {"200": "{positions, baseline, baseline_name, legend: [{tone, label}], rows: [{run_id, name, "
                                "url, measured, why, values, k, tau, evaluation_id, checkpoint_id, best, epoch, "
                                "checkpoint_url, cells: [{position, value, text, delta, delta_text, tone}]}]}"}}

    def get(self, request):
        """Each run's acceptance per draft position (its best checkpoint's measurement by our evaluate
        stage) and each cell's difference from the baseline run, worded (`delta_text`, in percentage points)
        and coloured (`tone`: same, up-1..3, down-1..3, base, none where the baseline has no such position,
        blank past a run's k). Runs outside the caller's projects are refused as unknown."""
        run_ids = comparison.compare_ids(request.query_params.getlist("ids"))
        baseline_id = comparison.baseline_id_parse(request.query_params.get("baseline"))
        return Response(comparison.run_acceptance(run_ids=run_ids, user=request.user, baseline_id=baseline_id))

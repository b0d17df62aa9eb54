"""/api/v1/ for what runs use and make: checkpoints (and measuring their acceptance), extractions
(import, verify), datasets (import, catalogue, regenerate), targets, the workers, and who is asking."""
from __future__ import annotations

from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from runs.api import shapes
from runs.api.base import ApiInputError, ApiView, accepted, created, paginate
from runs.api.bodies.serializers import (DatasetImportSerializer, EmptySerializer, EvaluateSerializer, ExportSerializer,
                                  ExtractionImportSerializer, RegenerateSerializer, VerifySerializer)
from runs.api.models import ApiToken
from runs.api.tokens import account_settings
from runs.checkpoints import evaluation as evaluation_services
from runs.checkpoints import serve_check_selectors
from runs.checkpoints.export import checkpoint_export
from runs.data import extractions as extraction_services
from runs.data import regeneration, regeneration_selectors
from runs.data import selectors as data_selectors
from runs.fleet.summary import fleet_summary
from runs.pipeline.jobs import selectors as job_selectors, services as job_services
from runs.pipeline import selectors, services
from runs.pipeline.status import upstream_commands
from runs.data.paths import check_under_data_roots
from runs.projects import selectors as project_selectors
from runs.pipeline.online.selectors import data_volume_free_bytes
from runs.roles import ROLES, require, user_roles
from runs.sweeps import selectors as sweep_selectors
from runs.web.forms import RegenerateForm
from workers.contract.errors import InputError
from workers.contract.target import default_layer_ids, read_target_config, target_weight_bytes

PAGE_SIZE = 50
PAGE = [("page", "integer", f"from 1; {PAGE_SIZE} a page")]


class CheckpointDetail(ApiView):
    responses = {"GET": {"200": "the checkpoint: path, losses, simulated and measured tau, serve command"}}

    def get(self, request, pk: int):
        """One checkpoint (trained here or imported) and its latest acceptance measurements."""
        project_selectors.checkpoint_visible_check(pk=pk, user=request.user)  # 404 outside the caller's projects
        checkpoint = selectors.checkpoint_get(pk=pk)
        usable, why = serve_check_selectors.checkpoint_usable(checkpoint)
        return Response(shapes.checkpoint_dict(
            checkpoint, request, evaluations=checkpoint.evaluations.select_related("requested_by")[:20],
            usable=usable, unusable_why=why, serve_command=upstream_commands.checkpoint_serve_command(checkpoint)))


class CheckpointEvaluate(ApiView):
    request_serializers = {"POST": EvaluateSerializer}
    field_names = {"prompts_path": "prompts"}
    responses = {"POST": {"202": "{evaluation, created: true}: queued for a GPU worker",
                          "200": "{evaluation, created: false}: one with these settings is already queued or running"}}

    def post(self, request, pk: int):
        """Measure the checkpoint's acceptance length (tau) on a worker, as its page's Measure button."""
        body = self.body()
        project_selectors.checkpoint_visible_check(pk=pk, user=request.user)  # 404 outside the caller's projects
        checkpoint = selectors.checkpoint_get(pk=pk)
        evaluation, created = evaluation_services.evaluation_request(
            checkpoint=checkpoint, user=request.user, prompts_path=(body.get("prompts") or "").strip() or None,
            max_new_tokens=body.get("max_new_tokens", 64), max_prompts=body.get("max_prompts", 32),
            num_speculative_tokens=body.get("num_speculative_tokens"))
        answer = {"evaluation": shapes.evaluation_row(evaluation), "created": created}
        return accepted(answer) if created else Response(answer)


class CheckpointExport(ApiView):
    request_serializers = {"POST": ExportSerializer}
    responses = {"POST": {"201": "{checkpoint_id, path, files, bytes, serve_command, card}: the folder written"}}

    def post(self, request, pk: int):
        """Write a new folder vLLM serves as it is: config.json, the weights and a README.md model card
        (its figures as `card`), as the page's Export button does."""
        body = self.body()
        project_selectors.checkpoint_visible_check(pk=pk, user=request.user)  # 404 outside the caller's projects
        checkpoint = selectors.checkpoint_get(pk=pk)
        return created(checkpoint_export(checkpoint=checkpoint, user=request.user, out_dir=body.get("out_dir")).as_dict())


class ExtractionList(ApiView):
    request_serializers = {"POST": ExtractionImportSerializer}
    field_names = {"target_path": "target"}
    query_params = {"GET": PAGE}
    responses = {"GET": {"200": "{count, page, pages, page_size, next, previous, results: [extractions]}"},
                 "POST": {"201": "the imported extraction; its headers are verified by a worker",
                          "200": "the extraction already registered at this path"}}

    def get(self, request):
        """Extractions, newest first, with their latest verification's verdict (`verified`)."""
        return Response(paginate(request, data_selectors.extraction_list_verified(user=request.user), page_size=PAGE_SIZE,
                                 shape=lambda e: shapes.extraction_row(e, request)))

    def post(self, request):
        """Register an extraction made elsewhere (flat v1, speculators 0.4 or 0.9), as import_extraction does."""
        body = self.body()
        extraction, created = extraction_services.extraction_import(
            path=body["path"], target_path=body.get("target") or None, user=request.user, verify_on_worker=True)
        answer = extraction_answer(extraction.pk, request)
        return Response(answer, status=201 if created else 200)


def extraction_answer(pk: int, request) -> dict:
    extraction = data_selectors.extraction_get(pk=pk, user=request.user)
    return {"id": extraction.pk, **data_selectors.extraction_summary(extraction),
            "forecast": data_selectors.extraction_forecast(extraction),
            "verification_requests": [shapes.job_dict(shown) for shown in
                                      job_selectors.extraction_verification_requests(extraction=extraction)],
            "url": shapes.api_url(request, "extraction_detail", extraction.pk),
            "page_url": request.build_absolute_uri(extraction.get_absolute_url())}


class ExtractionDetail(ApiView):
    responses = {"GET": {"200": "what import_extraction --json prints, with its verification requests"}}

    def get(self, request, pk: int):
        """One extraction: layout, layers, tokens, provenance, latest verification."""
        return Response(extraction_answer(pk, request))


class ExtractionVerify(ApiView):
    request_serializers = {"POST": VerifySerializer}
    responses = {"POST": {"202": "{verification_request}: a worker reads the files"}}

    def post(self, request, pk: int):
        """Verify the extraction's files on a worker: headers, or every value with `full`."""
        body = self.body()
        extraction = data_selectors.extraction_get(pk=pk, user=request.user)
        job = job_services.extraction_verify_request(extraction=extraction, full=body.get("full", False),
                                                     user=request.user)
        return accepted({"verification_request": shapes.job_dict(job_selectors.JobShown(job=job, waiting_for_broker=""))})


class DatasetList(ApiView):
    request_serializers = {"POST": DatasetImportSerializer}
    query_params = {"GET": PAGE}
    responses = {"GET": {"200": "{count, page, pages, page_size, next, previous, results: [datasets]}"},
                 "POST": {"200": "the dataset (the same one when the file was registered before); a new or "
                                 "changed file is catalogued by a worker"}}

    def get(self, request):
        """Datasets by name, each with the dataset it was regenerated from (`regenerated_from`)."""
        return Response(paginate(request, data_selectors.dataset_list().order_by("name", "pk"), page_size=PAGE_SIZE,
                                 shape=lambda d: shapes.dataset_row(d, request)))

    def post(self, request):
        """Register a chat file: its first conversations are read now, the whole file by a worker."""
        body = self.body()
        require(request.user, "import")
        dataset = services.dataset_register(path=body["path"])
        return Response(dataset_answer(dataset.pk, request))


def dataset_answer(pk: int, request) -> dict:
    dataset = data_selectors.dataset_get(pk=pk, user=request.user)
    samples, excluded = job_selectors.dataset_sample_counts(dataset=dataset)
    return {**shapes.dataset_row(dataset, request), "notes": dataset.notes, "samples": samples, "excluded": excluded,
            "catalogues": [shapes.job_dict(shown) for shown in job_selectors.dataset_catalogues(dataset=dataset)],
            "regenerated_from": regeneration_selectors.dataset_provenance(dataset=dataset),
            "regenerations": [regeneration_selectors.regeneration_dict(shown.job) for shown in
                              regeneration_selectors.dataset_regenerations(dataset=dataset)]}


class DatasetDetail(ApiView):
    responses = {"GET": {"200": "the dataset: path, size, catalogued and excluded conversations, lineage"}}

    def get(self, request, pk: int):
        """One dataset, with its catalogue passes and the regenerations made from it."""
        return Response(dataset_answer(pk, request))


class DatasetCatalogue(ApiView):
    request_serializers = {"POST": EmptySerializer}
    responses = {"POST": {"202": "{catalogue}: a worker adds the file's new conversations to the catalogue"}}

    def post(self, request, pk: int):
        """Catalogue the dataset's file again (new conversations are added; one queued pass is reused)."""
        self.body()
        dataset = data_selectors.dataset_get(pk=pk, user=request.user)
        job = job_services.dataset_catalogue_request(dataset=dataset, user=request.user)
        return accepted({"catalogue": shapes.job_dict(job_selectors.JobShown(job=job, waiting_for_broker=""))})


class DatasetRegenerate(ApiView):
    request_serializers = {"POST": RegenerateSerializer}
    responses = {"POST": {"202": "{regeneration, queued: true}", "200": "{regeneration, queued: false}: these "
                                                                        "settings made (or are making) it already"}}

    def post(self, request, pk: int):
        """Have a target write the dataset's replies again (on-policy data), as the dataset page's form."""
        body = self.body()
        require(request.user, "launch")
        dataset = data_selectors.dataset_get(pk=pk, user=request.user)
        defaults = {"backend": "auto", "max_new_tokens": 512, "temperature": 0.0, "seed": 0, "max_samples": None,
                    "shards": None}
        data = {**defaults, **body}
        form = RegenerateForm(data={k: "" if v is None else v for k, v in data.items()})
        if not form.is_valid():
            raise ValidationError({name: list(errors) for name, errors in form.errors.items()})
        job, queued = regeneration.dataset_regenerate_request(
            dataset=dataset, target=form.cleaned_data["target"], settings=form.regeneration_settings(),
            user=request.user)
        answer = {"regeneration": regeneration_selectors.regeneration_dict(job), "queued": queued}
        return accepted(answer) if queued else Response(answer)


class TargetList(ApiView):
    query_params = {"GET": PAGE}
    responses = {"GET": {"200": "{count, ..., results: [targets]}"}}

    def get(self, request):
        """Target models registered here (by a launch or an import), with their default layer ids."""
        return Response(paginate(request, data_selectors.target_list().order_by("name", "pk"), page_size=PAGE_SIZE,
                                 shape=shapes.target_row))


class TargetInspect(ApiView):
    query_params = {"GET": [("path", "string", "a target directory under one of the data roots")]}
    responses = {"GET": {"200": "the target's config (layers, hidden size, vocab, dtype), path, "
                                "default_layer_ids, weight_bytes (null without weight files), "
                                "bytes_per_token_per_layer (an extraction's, bf16), data_free_bytes (the runs' volume)"}}

    def get(self, request):
        """What the launch form prefills for a typed target path, and the size of its weights, which a GPU
        backend's workers must hold. Nothing is registered."""
        try:
            path = check_under_data_roots(request.query_params.get("path", ""), kind="target directory")
            if not path.is_dir():
                raise InputError(f"target directory {path} is not a directory")
            cfg = read_target_config(path)
        except InputError as exc:
            raise ApiInputError(str(exc), field="path") from None
        # What an extraction stores per token and layer (bf16), and the room on the runs' volume: the form's
        # forecast of an offline extraction, which offers online hidden states when it would not fit.
        return Response({**cfg.as_dict(), "path": str(path), "default_layer_ids": default_layer_ids(cfg.num_layers),
                         "weight_bytes": target_weight_bytes(path), "bytes_per_token_per_layer": 2 * cfg.hidden_size,
                         "data_free_bytes": data_volume_free_bytes()})


class SweepDetail(ApiView):
    responses = {"GET": {"200": "{sweep_id, name, mode, keys, varied, run_ids, runs, statuses, best, measured, "
                                "finished, hidden_runs, again_url}: what launch_sweep prints, of the runs the "
                                "caller sees (hidden_runs: how many are in projects they do not see)"}}

    def get(self, request, pk: int):
        """A sweep's state, as its page polls it."""
        sweep = sweep_selectors.sweep_get(pk=pk, user=request.user)  # 404 outside the user's projects
        return Response(sweep_selectors.sweep_summary(sweep=sweep, user=request.user))


class Workers(ApiView):
    responses = {"GET": {"200": "{workers, launch_options, queue, refused_by_broker, waiting_for_retry}"}}

    def get(self, request):
        """The fleet: each worker and what it is doing, what a launch can ask for now, the queue."""
        return Response(fleet_summary(user=request.user))


class Me(ApiView):
    responses = {"GET": {"200": "{username, roles, teams, team_may_act, token}"}}

    def get(self, request):
        """Who the token (or session) acts as, with which roles."""
        user = request.user
        token = request.auth if isinstance(request.auth, ApiToken) else None
        return Response({
            "username": user.get_username(), "roles": sorted(user_roles(user)),
            "teams": sorted(g.name for g in user.groups.all() if g.name not in ROLES),
            "team_may_act": account_settings(user=user).team_may_act,
            "token": {"name": token.name, "prefix": token.prefix, "created_at": token.created_at.isoformat()}
            if token else None})

"""A launch's JSON body through the launch form: the form's checks and its RunConfig, so that the API,
the page and run_pipeline launch the same run from the same settings and refuse the same ones."""
from __future__ import annotations

from rest_framework.exceptions import ValidationError

from runs.pipeline.launch.run_config import RunConfig
from runs.web.forms import LaunchForm

# The body's names for the form's fields (run_pipeline's options); the others are the same.
BODY_NAMES = {"target_path": "target", "dataset_path": "dataset"}
FORM_NAMES = {body: form for form, body in BODY_NAMES.items()}


def form_data(body: dict, *, base: dict | None = None) -> dict:
    """The form's POST data: `base` (a copied run's values, or RunConfig's defaults as run_pipeline
    takes them) with the body's values over it."""
    defaults = RunConfig().as_dict()
    data = {**defaults, "layer_ids": [], "name": "", **(base or {})}
    for key, value in body.items():
        data[FORM_NAMES.get(key, key)] = value
    if isinstance(data.get("layer_ids"), (list, tuple)):
        data["layer_ids"] = ", ".join(str(i) for i in data["layer_ids"])
    if isinstance(data.get("capture_urls"), (list, tuple)):  # the form's box holds one URL a line
        urls = data["capture_urls"]
        if not all(isinstance(url, str) for url in urls):
            raise ValidationError({"capture_urls": ["capture_urls must be a list of URLs (text)"]})
        if any(not url.strip() or any(c.isspace() for c in url.strip()) for url in urls):
            raise ValidationError({"capture_urls": ["each of capture_urls must be one URL, without spaces"]})
        data["capture_urls"] = "\n".join(url.strip() for url in urls)
    concurrency = data.get("serve_concurrency")
    if isinstance(concurrency, (list, tuple)):  # the form's box: numbers separated by commas
        if not all(isinstance(c, int) and not isinstance(c, bool) for c in concurrency):
            raise ValidationError({"serve_concurrency": ["serve_concurrency must be a list of whole numbers, 1 to 256"]})
        if not concurrency:  # the form reads an empty box as the default; an empty list asks for no level
            raise ValidationError({"serve_concurrency": ["serve_concurrency must list 1 to 8 concurrencies, got 0"]})
        data["serve_concurrency"] = ", ".join(str(c) for c in concurrency)
    elif "serve_concurrency" in body and concurrency not in (None, ""):  # a copied run's base holds the form's text
        raise ValidationError({"serve_concurrency": ["serve_concurrency must be a list of whole numbers, 1 to 256"]})
    # The form's boxes hold a suite a line (NAME=PATH) and the weights as NAME=WEIGHT separated by commas.
    for key, joiner in (("eval_suites", "\n"), ("best_suite_weights", ", ")):
        value = data.get(key)
        if isinstance(value, dict):
            if not all(isinstance(name, str) and "=" not in name and "," not in name and "\n" not in name
                       for name in value):
                raise ValidationError({key: [f"{key} must map suite names to values"]})
            if key == "eval_suites" and not all(isinstance(path, str) and "\n" not in path for path in value.values()):
                raise ValidationError({key: ["eval_suites must map each suite name to a path (text, or \"\" for a "
                                             "registered suite)"]})
            data[key] = joiner.join(f"{name}={v}" if v != "" else name for name, v in value.items())
        elif value not in (None, ""):
            raise ValidationError({key: [f"{key} must be an object mapping suite names to values"]})
    # The form reads an empty value as "not given", as a browser sends it.
    return {key: "" if value is None else value for key, value in data.items()}


def launch_form(body: dict, *, base: dict | None = None) -> LaunchForm:
    """The bound, valid form; ValidationError naming the body's fields otherwise."""
    form = LaunchForm(data=form_data(body, base=base))
    if not form.is_valid():
        raise ValidationError({BODY_NAMES.get(name, name) if name != "__all__" else "non_field_errors": list(errors)
                               for name, errors in form.errors.items()})
    return form

"""import_extraction and verify_extraction over extractions laid out as users have them."""
import io
import json

import pytest
from django.core.management import CommandError, call_command

from runs.models import Extraction, Verification
from tests.contract.test_verify import write_09, write_flat, write_v04

pytestmark = pytest.mark.django_db


@pytest.fixture
def target(data_root):
    path = data_root / "import-target"
    path.mkdir(exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8,
              "hidden_size": 16, "vocab_size": 1000}
    (path / "config.json").write_text(json.dumps(config))
    return path


def run(command, *args):
    out = io.StringIO()
    call_command(command, *args, "--json", stdout=out)
    return json.loads(out.getvalue())


@pytest.mark.parametrize("writer,layout", [(write_flat, "flat_v1"), (write_v04, "speculators_v04"),
                                           (write_09, "speculators_09")])
def test_each_layout_imports_and_passes_verification(data_root, target, writer, layout):
    directory = writer(data_root / f"ext-{layout}")
    summary = run("import_extraction", str(directory), "--target", str(target))
    assert summary["created"] is True
    assert summary["layout"] == layout
    assert summary["verification"]["passed"] is True
    assert Extraction.objects.get(pk=summary["extraction_id"]).manifest.format_version


def test_importing_twice_does_not_duplicate(data_root, target):
    directory = write_flat(data_root / "ext-twice")
    first = run("import_extraction", str(directory), "--target", str(target))
    second = run("import_extraction", str(directory), "--target", str(target))
    assert second["created"] is False and second["extraction_id"] == first["extraction_id"]
    assert Extraction.objects.count() == 1


def test_import_refuses_a_directory_outside_the_roots(tmp_path_factory, target, settings):
    outside = write_flat(tmp_path_factory.mktemp("outside"))
    settings.EAGLE3WEB_DATA_ROOTS = [target.parent.resolve() / "only-here"]
    with pytest.raises(CommandError, match="outside the allowed data roots"):
        run("import_extraction", str(outside), "--target", str(target))
    assert Extraction.objects.count() == 0


def test_malformed_manifest_is_named_and_nothing_is_stored(data_root, target):
    directory = write_flat(data_root / "ext-bad-json")
    (directory / "data_config.json").write_text("{not json")
    with pytest.raises(CommandError, match="data_config.json"):
        run("import_extraction", str(directory), "--target", str(target))
    assert Extraction.objects.count() == 0


def test_a_count_mismatch_fails_the_import_with_the_numbers(data_root, target):
    directory = write_flat(data_root / "ext-count", total_samples=99)
    with pytest.raises(CommandError, match="sample_count"):
        run("import_extraction", str(directory), "--target", str(target))
    verification = Verification.objects.get()
    assert verification.passed is False
    assert any(c["name"] == "sample_count" and c["verdict"] == "fail" for c in verification.checks)


def test_verify_full_catches_nans_that_headers_miss(data_root, target):
    import torch
    from safetensors.torch import load_file, save_file

    directory = write_09(data_root / "ext-nan")
    summary = run("import_extraction", str(directory), "--target", str(target))
    sample = sorted((directory / "hidden_states").glob("hs_*.safetensors"))[0]
    tensors = load_file(str(sample))
    tensors["hidden_states"][0, 0, 0] = float("nan")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(sample))
    run("verify_extraction", str(summary["extraction_id"]))  # headers only: passes
    with pytest.raises(CommandError, match="finite"):
        run("verify_extraction", str(summary["extraction_id"]), "--full")
    assert Verification.objects.filter(extraction_id=summary["extraction_id"]).count() == 3
    assert torch.isnan(load_file(str(sample))["hidden_states"]).any()


def test_a_viewer_may_not_import_from_the_command_line(data_root, target):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    viewer = get_user_model().objects.create_user("vera")
    viewer.groups.add(Group.objects.get_or_create(name="viewer")[0])
    with pytest.raises(CommandError, match="vera may not import"):
        run("import_extraction", str(write_flat(data_root / "ext-viewer")), "--target", str(target), "--user", "vera")
    assert Extraction.objects.count() == 0

"""import_extraction of a speculators 0.9 directory checks token ids against the dataset beside it."""
import io
import json

import pytest
from django.core.management import CommandError, call_command

from runs.models import Extraction, Verification
from tests.contract.test_verify_prepared_beside import write_upstream_09

pytestmark = pytest.mark.django_db


@pytest.fixture
def target(data_root):
    path = data_root / "beside-target"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  "num_hidden_layers": 8, "hidden_size": 16, "vocab_size": 100}))
    return path


def _import(directory, target) -> dict:
    out = io.StringIO()
    call_command("import_extraction", str(directory), "--target", str(target), "--json", stdout=out)
    return json.loads(out.getvalue())


def test_import_of_a_good_upstream_directory_checks_its_token_ids_and_passes(data_root, target):
    root = write_upstream_09(data_root / "upstream-good")
    summary = _import(root, target)
    assert summary["layout"] == "speculators_09" and summary["verification"]["passed"] is True
    verification = Verification.objects.get(extraction_id=summary["extraction_id"])
    check = next(c for c in verification.checks if c["name"] == "prepared_tokens")
    assert check["verdict"] == "pass" and verification.report["prepared_dir"] == str(root)


def test_import_of_reversed_token_ids_fails_naming_the_sample_and_keeps_the_failed_verification(data_root, target):
    root = write_upstream_09(data_root / "upstream-reversed", reverse=1)
    with pytest.raises(CommandError, match=r"prepared_tokens: hs_1\.safetensors: token ids differ from row 1"):
        _import(root, target)
    verification = Verification.objects.get(extraction=Extraction.objects.get(path=str(root.resolve())))
    check = next(c for c in verification.checks if c["name"] == "prepared_tokens")
    assert not verification.passed and check["verdict"] == "fail"
    assert check["offending_files"] == ["hs_1.safetensors"]

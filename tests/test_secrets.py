"""Issue 41, item 1: a secret is decided from the names of known credentials (vLLM's, Hugging
Face's, the cloud providers', ...) and names shaped like one, never from a substring such as
TOKEN; a setting is taken, a typo gets vLLM's did-you-mean, and each refusal names what the
secret protects (docs/secrets.md)."""

from __future__ import annotations

import pytest
from helpers import profile_copy

from launcher.errors import UserError
from launcher.schema import cluster, recipe, secrets

SEED = "qwen3.5-397b-gb200-disagg"

SETTINGS = [  # environment variables that are settings, whatever they contain
    "TOKENIZERS_PARALLELISM", "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE",
    "VLLM_MAX_BAD_WORDS_TOTAL_TOKENS", "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD",
    "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD", "VLLM_USE_FASTOKENS", "HF_TOKEN_PATH",
    "AWS_REGION", "AZURE_CLIENT_ID", "SSL_KEYFILE", "NCCL_SOCKET_IFNAME", "KEYBOARD",
]
SECRETS = {  # name -> words of what it protects
    "HF_TOKEN": "Hugging Face access token",
    "HUGGING_FACE_HUB_TOKEN": "Hugging Face access token",
    "VLLM_API_KEY": "API key vLLM's server requires",
    "S3_SECRET_ACCESS_KEY": "S3 secret",
    "AWS_SECRET_ACCESS_KEY": "AWS secret access key",
    "AWS_SESSION_TOKEN": "AWS session token",
    "AZURE_CLIENT_SECRET": "Azure service principal's secret",
    "AZURE_STORAGE_KEY": "an Azure key",
    "AZURE_OPENAI_API_KEY": "an Azure key",
    "GOOGLE_APPLICATION_CREDENTIALS": "Google Cloud service account key",
    "WANDB_API_KEY": "Weights & Biases API key",
    "OPENAI_API_KEY": "OpenAI API key",
    "NGC_API_KEY": "NGC API key",
    "MY_SERVICE_API_KEY": "ends in _API_KEY",
    "DB_PASSWORD": "ends in _PASSWORD",
    "APP_SECRET": "ends in _SECRET",
    "SIGNING_SECRET_KEY": "ends in _SECRET_KEY",
    "GRAFANA_ACCESS_TOKEN": "ends in _ACCESS_TOKEN",
    "SLACK_AUTH_TOKEN": "ends in _AUTH_TOKEN",
}
# flags of vLLM 0.33 that hold no secret (the old rule refused each: "-token" in the name)
FLAG_SETTINGS = ["dbo-decode-token-threshold", "long-prefill-token-threshold",
                 "max-num-batched-tokens", "tokenizer", "ssl-keyfile"]


def _err(sets: list[str], ref: str = SEED) -> str:
    with pytest.raises(UserError) as e:
        recipe.load(ref, sets)
    return str(e.value)


@pytest.mark.parametrize("where", ["env", "decode.env"])
def test_settings_are_not_secrets(where):
    r = recipe.load(SEED, [f"{where}.{name}=1" for name in SETTINGS])
    env = r.env if where == "env" else r.decode.env
    assert set(SETTINGS) <= set(env)
    assert all(secrets.secret_env(n) is None for n in SETTINGS)


@pytest.mark.parametrize("name, what", SECRETS.items())
def test_each_secret_is_refused_naming_what_it_protects(name, what):
    for where in ("env", "prefill.env"):
        msg = _err([f"{where}.{name}=x"])
        assert f"{where}.{name} is a secret (" in msg and what in msg, msg
        assert "env_from_host" in msg and "never lands in the sbatch script" in msg, msg


def test_a_cluster_profiles_secret_is_refused_and_its_setting_taken(tmp_path):
    with pytest.raises(UserError) as e:
        cluster.load(profile_copy(tmp_path / "a.json", "local", env={"HF_TOKEN": "hf_x"}))
    assert "env.HF_TOKEN is a secret (the Hugging Face access token)" in str(e.value)
    ok = cluster.load(profile_copy(tmp_path / "b.json", "local",
                                   env={"TOKENIZERS_PARALLELISM": "false"}))
    assert ok.env == {"TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.parametrize("where", ["vllm_args", "prefill.args", "decode.args",
                                   "decode.args_from_concurrency.4096", "router.args"])
def test_secret_flags_are_refused_and_token_flags_taken(where):
    for flag, words in [("api-key", "API key"), ("api_key", "API key"),
                        ("hf-token", "Hugging Face access token"),
                        ("db-password", "ends in -password")]:
        if where == "router.args" and flag == "hf-token":
            continue
        msg = _err([f"{where}.{flag}=x"])
        assert f"{where}.{flag} carries a secret (" in msg and words in msg, msg
        if where == "router.args" and "api" in flag:
            assert "the router sends its workers" in msg and "command line only" in msg, msg
        elif "api" in flag:
            assert "export VLLM_API_KEY instead" in msg and "env_from_host" in msg, msg
    if where != "router.args":
        recipe.load(SEED, [f"{where}.{flag}=8" for flag in FLAG_SETTINGS[:2]])


def test_the_issue_commands(cli, tmp_path):
    """The settings pass the dry-run; the seed's flag misspelt gets vLLM's did-you-mean."""
    runs = str(tmp_path / "runs")
    for setting in ("env.TOKENIZERS_PARALLELISM=false",
                    "env.VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE=163840"):
        rc, out, err = cli("submit", SEED, "--dry-run", "--runs-dir", runs, "--set", setting)
        assert rc == 0 and "secret" not in err, (setting, err)
    rc, out, err = cli("submit", SEED, "--dry-run", "--runs-dir", runs,
                       "--set", "prefill.args.max-num-batched-token=8192")
    assert rc == 2 and "secret" not in err, err
    # vLLM would take it as --max-num-batched-tokens (allow_abbrev); the launcher's own
    # checks read the full name, so it is refused with the name meant
    assert "prefill.args.max-num-batched-token is short for --max-num-batched-tokens" in err
    assert "did you mean '--max-num-batched-tokens'?" in err, err
    rc, out, err = cli("submit", SEED, "--dry-run", "--runs-dir", runs, "--set", "env.HF_TOKEN=x")
    assert rc == 2 and "env.HF_TOKEN is a secret (the Hugging Face access token)" in err, err


def test_the_docs_list_every_name_the_code_decides_by():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "secrets.md").read_text()
    for name in [*secrets.SECRET_ENV, *secrets.SECRET_ENDINGS]:
        assert f"`{name}`" in doc, name
    for flag in secrets.SECRET_FLAGS:
        assert f"`--{flag}`" in doc, flag

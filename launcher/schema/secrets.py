"""Which environment variables and command-line flags hold a secret: a value that must never
be written down (sbatch script, plan.json, commands.sh, logs). Such a value travels by name
(a recipe's env_from_host) from the submitting shell to the process that reads it.

A secret is decided by a list of names the programs around a run read, and by a name whose
ending says it is one; never by a substring (TOKENIZERS_PARALLELISM and
VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE are settings). The list and its sources: docs/secrets.md.
"""

from __future__ import annotations

# Environment variables read as credentials, with what each one protects.
SECRET_ENV = {
    # vLLM (vllm/envs.py; vllm/entrypoints/serve/middleware/register.py)
    "VLLM_API_KEY": "the API key vLLM's server requires of every request",
    "S3_ACCESS_KEY_ID": "the S3 key id vLLM loads weights with (half of the key pair)",
    "S3_SECRET_ACCESS_KEY": "the S3 secret vLLM loads weights with",
    # Hugging Face (huggingface_hub/utils/_auth.py)
    "HF_TOKEN": "the Hugging Face access token",
    "HUGGING_FACE_HUB_TOKEN": "the Hugging Face access token (its older name)",
    # AWS (AWS CLI, "Environment variables to configure the AWS CLI")
    "AWS_ACCESS_KEY_ID": "the AWS access key id (half of the key pair)",
    "AWS_SECRET_ACCESS_KEY": "the AWS secret access key",
    "AWS_SESSION_TOKEN": "the AWS session token",
    "AWS_SECURITY_TOKEN": "the AWS session token (its older name)",
    # Azure (azure-identity EnvironmentCredential; Azure CLI storage variables)
    "AZURE_CLIENT_SECRET": "the Azure service principal's secret",
    "AZURE_PASSWORD": "the Azure user's password",
    "AZURE_STORAGE_CONNECTION_STRING": "the Azure storage connection string (it holds the key)",
    "AZURE_STORAGE_SAS_TOKEN": "the Azure storage SAS token",
    # Google Cloud (Application Default Credentials)
    "GOOGLE_APPLICATION_CREDENTIALS": "the Google Cloud service account key file",
    # services a benchmark job meets
    "WANDB_API_KEY": "the Weights & Biases API key",
    "OPENAI_API_KEY": "the OpenAI API key",
    "NGC_API_KEY": "the NVIDIA NGC API key",
    "NGC_CLI_API_KEY": "the NVIDIA NGC API key",
    "NVIDIA_API_KEY": "the NVIDIA API key",
    "GITHUB_TOKEN": "the GitHub token",
    "GH_TOKEN": "the GitHub token",
}
# Endings that make a name a secret whoever reads it (AZURE_STORAGE_KEY: see secret_env).
SECRET_ENDINGS = ("_API_KEY", "_SECRET", "_SECRET_KEY", "_PASSWORD", "_PASSWD",
                  "_ACCESS_TOKEN", "_AUTH_TOKEN")
# `vllm serve` flags whose value is a credential (vLLM 0.33's flag table), and the variable
# vLLM reads in its place; vllm-router's --api-key has none.
SECRET_FLAGS = {
    "api-key": ("the API key the server requires of every request",
                "export VLLM_API_KEY instead (vLLM reads it when --api-key is not given)"),
    "hf-token": ("the Hugging Face access token",
                 "export HF_TOKEN instead (vLLM's Hugging Face downloads read it)"),
}
ROUTER_API_KEY = ("the API key the router sends its workers",
                  "vllm-router reads it from its command line only, so the launcher cannot "
                  "pass it without writing it down")


def _ending(name: str) -> str | None:
    up = name.upper()
    return next((e for e in SECRET_ENDINGS if up.endswith(e) or up == e[1:]), None)


def secret_env(name: str) -> str | None:
    """What the variable's value protects, if it is a secret; None if it is a setting."""
    up = name.upper()
    if up in SECRET_ENV:
        return SECRET_ENV[up]
    if up.startswith("AZURE_") and up.endswith("_KEY"):
        return "an Azure key"
    if (end := _ending(name)) is not None:
        return f"a credential by its name: it ends in {end}"
    return None


def secret_flag(key: str, router: bool = False) -> tuple[str, str] | None:
    """(what the flag's value protects, what to do instead) if it carries a secret."""
    name = key.lstrip("-").replace("_", "-").lower()
    if name in SECRET_FLAGS:
        return ROUTER_API_KEY if router and name == "api-key" else SECRET_FLAGS[name]
    if (end := _ending(name.replace("-", "_"))) is not None:
        return (f"a credential by its name: it ends in {end.lower().replace('_', '-')}",
                "pass it as an environment variable the program reads instead")
    return None


def env_refusal(where: str, what: str, listed: str = "env_from_host") -> str:
    return (f"{where} is a secret ({what}): list its name under {listed} instead, so the job "
            "takes its value from your environment and it never lands in the sbatch script, "
            "plan or logs")


def flag_refusal(where: str, what: str, instead: str) -> str:
    return (f"{where} carries a secret ({what}): a flag's value is written into commands.sh, "
            f"plan.json and the logs; {instead}" + (
                "" if instead.startswith("vllm-router") else
                ", and list its name under env_from_host"))

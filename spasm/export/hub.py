"""``spasm export … --push-to-hub OWNER/NAME``: the export folder uploaded as a Hub dataset.

With ``huggingface_hub`` (``pip install 'spasm[hub]'``): the repo is created if missing
(``--private`` applies then), the branch ``--revision`` is created if missing, and the folder
is uploaded in one commit. Files an earlier push of an export left under ``data/``, ``openai/``
and ``sharegpt/`` that this export does not have (a split that is now empty) are deleted in the
same commit; other files in the repo are left alone, and hidden files (the output marker) are
not uploaded. The token is read from the environment
variable named by ``--hub-token-env`` (default ``HF_TOKEN``), the way backends read their API
keys (:func:`spasm.backends.keys.resolve_api_key`); it is never taken from a saved login.

:meth:`HubTarget.prepare` checks all of that before the export runs, so a bad repo id or a
missing token fails fast (exit 2); the pipeline uploads only an export that passed its checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spasm.errors import MissingKeyError, RunError, UserError

__all__ = ["EXPORT_PATTERNS", "HubTarget"]

#: What an export owns in the repo: stale files matching these are deleted on upload.
EXPORT_PATTERNS = ["data/*", "openai/*", "sharegpt/*"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise UserError("--push-to-hub needs huggingface_hub: pip install 'spasm[hub]'") from None
    return huggingface_hub


@dataclass(frozen=True)
class HubTarget:
    """Where an export goes on the Hub, checked before the export runs."""

    repo_id: str
    token: str
    private: bool = False
    revision: str | None = None
    endpoint: str | None = None

    @classmethod
    def prepare(cls, repo_id: str, *, token_env: str = "HF_TOKEN", private: bool = False,
                revision: str | None = None, endpoint: str | None = None) -> HubTarget:
        """Check the repo id, that ``huggingface_hub`` is installed and that the token is set."""
        from spasm.backends.keys import resolve_api_key

        if not _REPO_ID.match(repo_id) or ".." in repo_id or repo_id.endswith((".git", ".")):
            raise UserError(f"--push-to-hub {repo_id!r}: name a dataset repo as OWNER/NAME (letters, digits, "
                            "'-', '_', '.'), e.g. my-org/spasm-dialogues")
        if revision is not None and (not revision.strip() or revision != revision.strip()):
            raise UserError(f"--revision {revision!r}: name a branch, e.g. v1")
        _hub()
        try:
            token = resolve_api_key(token_env, "the Hugging Face Hub")
        except MissingKeyError as exc:
            raise UserError(f"--push-to-hub needs a Hub token with write access in the environment "
                            f"variable {token_env}, which is {exc.problem}. Put it there (export "
                            f"{token_env}=hf_...) or name another variable with --hub-token-env.") from None
        return cls(repo_id, token, private, revision, endpoint)

    def url(self) -> str:
        """The dataset's page (on the branch when one is named)."""
        base = (self.endpoint or _hub().constants.ENDPOINT).rstrip("/")
        return f"{base}/datasets/{self.repo_id}" + (f"/tree/{self.revision}" if self.revision else "")

    def upload(self, folder: Path) -> str:
        """Create the repo (and branch) if missing and upload ``folder`` in one commit; the
        dataset's address. A refusal or an unreachable Hub is a :class:`RunError`."""
        hub = _hub()
        api = hub.HfApi(endpoint=self.endpoint, token=self.token)
        try:
            api.create_repo(self.repo_id, repo_type="dataset", private=self.private, exist_ok=True)
            if self.revision is not None:
                api.create_branch(self.repo_id, repo_type="dataset", branch=self.revision, exist_ok=True)
            api.upload_folder(repo_id=self.repo_id, repo_type="dataset", folder_path=folder,
                              revision=self.revision, delete_patterns=EXPORT_PATTERNS, ignore_patterns=[".*"],
                              commit_message=f"spasm export: {folder.name}")
        except Exception as exc:  # HTTP refusals, connection errors (httpx's own), bad metadata: one RunError
            status = getattr(getattr(exc, "response", None), "status_code", None)
            hint = (" (is the token valid, with write access to the namespace?)" if status in (401, 403)
                    else "")
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RunError(f"uploading {folder} to the Hub as {self.repo_id} failed{hint}: {first}. The "
                           f"export in {folder} is complete; run the command again with --overwrite to retry "
                           "the upload.") from exc
        return self.url()

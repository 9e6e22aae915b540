"""A real keyring backend that keeps its secrets in a dict, for tests (CI has no system keyring)."""

from __future__ import annotations

from keyring.backend import KeyringBackend


class DictKeyring(KeyringBackend):
    """A real keyring backend that keeps its secrets in a dict (the system one is absent on CI)."""

    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.store: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.store.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.store[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.store.pop((service, username), None)

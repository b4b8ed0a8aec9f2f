"""The platforms ``opgate alert --platform`` knows, by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from opgate.reports.alerts import dingtalk, discord, feishu, slack, teams, webhook, wecom
from opgate.reports.alerts.message import Alert
from opgate.reports.alerts.transport import Acceptance, Response


@dataclass(frozen=True)
class Platform:
    """One chat platform: where its URL/secret live, how to build and judge a post."""

    name: str
    url_env: str
    secret_env: str | None
    build: Callable[[Alert, str, str | None, float], tuple[str, Any]]
    check: Callable[[Response], Acceptance]
    confirms_delivery: bool = True
    #: takes an idempotency key (so a repeat after an unclear failure cannot post twice)
    idempotent: bool = False

    @classmethod
    def of(cls, name: str, module: ModuleType) -> Platform:
        confirms = bool(getattr(module, "CONFIRMS_DELIVERY", True))
        idempotent = bool(getattr(module, "IDEMPOTENT", False))
        return cls(name, module.URL_ENV, module.SECRET_ENV, module.build, module.check, confirms, idempotent)


PLATFORMS: dict[str, Platform] = {
    name: Platform.of(name, module)
    for name, module in (
        ("slack", slack),
        ("feishu", feishu),
        ("dingtalk", dingtalk),
        ("wecom", wecom),
        ("teams", teams),
        ("discord", discord),
        ("webhook", webhook),
    )
}


def main() -> int:
    """One ``name URL_ENV`` line per platform: the nightly alert step loops over them."""
    for platform in PLATFORMS.values():
        print(platform.name, platform.url_env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

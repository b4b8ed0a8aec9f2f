"""Chat alerts for regressions in a diff: Slack, Feishu/Lark, DingTalk, WeCom, Teams, Discord, webhook.

One module per platform (payload format, limits, how its answers report
errors), one transport (urllib, retries, redaction), one dedup store.
"""

from __future__ import annotations

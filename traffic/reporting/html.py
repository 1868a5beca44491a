"""What the report's pages share: the style sheet, escaping, number cells and byte sizes."""

from __future__ import annotations

import html

from traffic.core.text import human_bytes

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1f3b57;color:#fff;padding:18px 28px}header h1{margin:0 0 4px;font-size:22px}
header .meta{opacity:.85;font-size:13px}main{padding:10px 28px 40px;max-width:1100px}
section{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:14px 18px;margin:16px 0}
h2{font-size:17px;margin:0 0 10px}table{border-collapse:collapse;width:100%;margin:6px 0}
th,td{padding:4px 8px;border-bottom:1px solid #eceef1;text-align:left;vertical-align:top}
th{font-weight:600;color:#4a5563;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
td.n{text-align:right;font-variant-numeric:tabular-nums}.badge{color:#fff;border-radius:3px;padding:1px 6px;font-size:12px}
.cards{display:flex;flex-wrap:wrap;gap:12px}.card{flex:1 1 150px;background:#fff;border:1px solid #dde1e6;
border-radius:6px;padding:10px 14px}.card b{display:block;font-size:20px}.card span{color:#5b6573;font-size:12px}
.chart .ct{font-weight:600;font-size:13px}.chart .ax{font-size:10px;fill:#5b6573}.chart .grid{stroke:#e3e6ea}
.empty{color:#6b7480;font-style:italic}.note{color:#5b6573;font-size:12px;max-width:560px}
.legend span{display:inline-block;margin-right:12px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;
margin-right:4px;vertical-align:middle}.cols{display:flex;gap:18px;flex-wrap:wrap}.cols>div{flex:1 1 420px}
a{color:#1f5f99}td.p{white-space:nowrap}
"""


def escape(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def number_cell(value: int | None, kind: str = "bytes") -> str:
    """A number cell: exact value with separators, human size as a tooltip, exact value as data."""
    value = value or 0
    title = f' title="{escape(human_bytes(value))}"' if kind == "bytes" else ""
    return f'<td class="n" data-{kind}="{value}"{title}>{value:,}</td>'

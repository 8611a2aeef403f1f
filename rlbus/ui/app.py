"""`rlbus ui`: pages over the store's read path, rendered on the server (Jinja2 templates and
SVG drawn in Python); the only script is static/ui.js, for keys. Everything ships in the
package: no CDN, nothing fetched."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rlbus.bus.store import StoreError
from rlbus.ui import charts
from rlbus.ui.charts import Series, bar_chart, line_chart
from rlbus.ui.figures import TABLES, run_figures
from rlbus.ui.graph import trace_svg
from rlbus.ui.message_view import message_views
from rlbus.ui.queries import CONSOLE_ROWS, CONSOLE_SECONDS, Queries, RolloutFilters
from rlbus.ui.source import StoreSource
from rlbus.ui.tokens import BUCKETS, Decoder, strips

LOCAL_HOSTS = ["127.0.0.1", "localhost", "::1"]
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


REWARD_COLUMNS = (
    "step",
    "rollouts",
    "errors",
    "mean_reward",
    "pass_rate",
    "held_out_rollouts",
    "held_out_mean_reward",
    "held_out_pass_rate",
)


class NotFound(Exception):
    """A run or rollout the store does not hold."""


def _templates() -> Environment:
    env = Environment(
        loader=PackageLoader("rlbus.ui", "templates"),
        autoescape=select_autoescape(default=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = charts.format_number
    env.filters["ts"] = lambda t: t.strftime("%Y-%m-%d %H:%M:%S") if t else "–"
    env.filters["qs"] = lambda params: urlencode(
        {k: v for k, v in params.items() if v not in ("", None)}
    )
    return env


def _params(request: Request) -> dict[str, str]:
    return dict(request.query_params)


class Pages:
    def __init__(self, queries: Queries, decoder: Decoder, source: StoreSource):
        self.q = queries
        self.decoder = decoder
        self.source = source
        self.templates = _templates()
        for name in self.templates.list_templates(extensions=["html"]):
            self.templates.get_template(name)  # compiled now, not in some user's first page

    def page(self, name: str, started: float, status: int = 200, **context: Any) -> HTMLResponse:
        """The template filled in; `started` is when the request's work began (Server-Timing:
        data = queries and drawing, total = with the template)."""
        built = time.perf_counter() - started
        html = self.templates.get_template(name).render(
            store_url=self.source.url,
            via=self.source.via,
            built_ms=f"{built * 1000:.0f}",
            **context,
        )
        total = time.perf_counter() - started
        return HTMLResponse(
            html,
            status_code=status,
            headers={
                "Server-Timing": f"data;dur={built * 1000:.1f}, total;dur={total * 1000:.1f}",
                "Content-Security-Policy": CSP,
                "Cache-Control": "no-store",
            },
        )

    def runs(self, request: Request) -> Response:
        started = time.perf_counter()
        return self.page("runs.html", started, title="runs", runs=self.q.runs())

    def run(self, request: Request) -> Response:
        started = time.perf_counter()
        run_id = request.path_params["run_id"]
        version = request.query_params.get("version", "")
        summary, data = self.q.run_page(run_id, version)
        if summary is None:
            raise NotFound(f"no run {run_id!r} in the store")
        reward = data["reward"]
        figures = {
            name: line_chart(f.series, f.title, f.x_label, f.y_axis)
            for name, f in run_figures(data).items()
        }
        return self.page(
            "run.html",
            started,
            title=f"run {run_id}",
            run=summary,
            figures=figures,
            tables={
                "reward": [{k: r[k] for k in REWARD_COLUMNS} for r in reward],
                **{key: data[key] for key in TABLES if key != "reward"},
            },
            headings=TABLES,
            others=[r for r in data["run_ids"] if r != run_id][:50],
            version=version,
            versions=data["versions"],
        )

    def rollouts(self, request: Request) -> Response:
        started = time.perf_counter()
        params = _params(request)
        filters, problems = RolloutFilters.parse(params)
        found = self.q.parallel(  # the menus are cached: on a miss, they load alongside
            {
                "page": lambda: self.q.rollouts(
                    filters, params.get("after", ""), params.get("before", "")
                ),
                "choices": lambda: self.q.filter_choices(filters.run),
                "runs": self.q.run_ids,
            }
        )
        return self.page(
            "rollouts.html",
            started,
            title="rollouts",
            filters=filters,
            problems=problems,
            query=filters.query_string(),
            **found,
        )

    def rollout(self, request: Request) -> Response:
        started = time.perf_counter()
        rollout_id = request.path_params["rollout_id"]
        found = self.q.rollout_page(rollout_id)
        row, nodes, records, scores = (found[k] for k in ("row", "nodes", "records", "scores"))
        if row is None:
            raise NotFound(f"no rollout {rollout_id!r} in the store")
        model_s = sum(r.duration_s for r in records)
        calls = [
            {
                "index": r.call_index,
                "seconds": r.duration_s,
                "tokens": len(r.completion_ids) // 4,
                "version": r.policy_version,
                "finish_reason": r.finish_reason,
            }
            for r in sorted(records, key=lambda r: r.call_index)
        ]
        total = row["duration_s"]
        timing = {
            "total": total,
            "model": model_s,
            "harness": max(total - model_s, 0.0),
            "model_pct": 100 * model_s / total if total else 0,
        }
        return self.page(
            "rollout.html",
            started,
            title=f"rollout {rollout_id}",
            r=row,
            info=json.loads(row["info"] or "{}"),
            prompt=message_views(row["prompt"]),
            completion=message_views(row["completion"], "assistant"),
            svg=trace_svg(nodes),
            nodes=sorted(nodes, key=lambda n: n.index),
            node_message=lambda n: message_views([n.message])[0],
            scores=scores,
            timing=timing,
            calls=calls,
            strips=strips(nodes, records, self.decoder, row["model"]),
            buckets=range(BUCKETS),
        )

    def compare(self, request: Request) -> Response:
        started = time.perf_counter()
        params = _params(request)
        a, b = params.get("a", ""), params.get("b", "")
        context: dict[str, Any] = {"a": a, "b": b, "tasks": [], "task": ""}
        if not (a and b):
            context["runs"] = self.q.run_ids()
        else:
            data = self.q.compare(a, b, params.get("task", ""))
            context["runs"] = data["runs"]
            context["figure"] = line_chart(
                [
                    Series(f"{label} {name}", [(r["step"], r[column]) for r in data[label.lower()]])
                    for label in ("A", "B")
                    for column, name in (
                        ("mean_reward", "reward"),
                        ("held_out_mean_reward", "held-out"),
                    )
                ],
                "Reward by policy version",
                "version",
                "mean reward (score)",
            )
            context.update(
                tasks=data["tasks"],
                task=data["task"],
                sides=[
                    (label, run, [_readable(r) for r in data["sides"][run]])
                    for label, run in (("A", a), ("B", b))
                    if run in data["sides"]
                ],
            )
        return self.page("compare.html", started, title="compare runs", **context)

    def sql(self, request: Request) -> Response:
        started = time.perf_counter()
        sql = request.query_params.get("q", "").strip()
        context: dict[str, Any] = {
            "sql": sql,
            "result": None,
            "error": None,
            "figure": None,
            "limit_rows": CONSOLE_ROWS,
            "limit_s": CONSOLE_SECONDS,
        }
        if sql:
            try:
                result, seconds = self.q.console(sql)
            except StoreError as exc:
                context["error"] = str(exc)
            except Exception as exc:  # the engine's message is the useful part
                context["error"] = f"query failed: {exc}"
            else:
                rows = result.rows[:CONSOLE_ROWS]
                context.update(
                    result=result,
                    rows=rows,
                    truncated=len(result.rows) >= CONSOLE_ROWS,
                    seconds=seconds,
                    figure=_quick_chart(result.columns, rows),
                )
        return self.page("sql.html", started, title="sql", **context)


def _readable(row: dict[str, Any]) -> dict[str, Any]:
    return {
        **row,
        "prompt_messages": message_views(row["prompt"]),
        "messages": message_views(row["completion"], "assistant"),
    }


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _quick_chart(columns: tuple[str, ...], rows: list[tuple]) -> Any:
    """Numeric columns against the first: a line over a numeric first column, bars over labels."""
    if len(columns) < 2 or not rows:
        return None
    numeric = [
        i for i in range(1, len(columns)) if all(_numeric(r[i]) or r[i] is None for r in rows)
    ]
    if not numeric:
        return None
    picked = numeric[:4]
    if all(_numeric(r[0]) for r in rows):
        return line_chart(
            [Series(columns[i], [(float(r[0]), r[i]) for r in rows]) for i in picked],
            "quick chart",
            columns[0],
            ", ".join(columns[i] for i in picked),
        )
    shown = rows[:60]
    return bar_chart(
        [str(r[0]) for r in shown],
        [Series(columns[i], [(n, r[i]) for n, r in enumerate(shown)]) for i in picked],
        "quick chart",
        ", ".join(columns[i] for i in picked),
    )


def _handled(pages: Pages, handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
    """A page, or an error page that says what is missing (never a bare 500 for a known case)."""

    def endpoint(request: Request) -> Response:
        try:
            return handler(request)
        except NotFound as exc:
            problem, status = ("not found", str(exc)), 404
        except StoreError as exc:
            problem, status = ("store unavailable", str(exc)), 503
        title, message = problem
        return pages.page("error.html", time.perf_counter(), status, title=title, message=message)

    endpoint.__name__ = handler.__name__
    return endpoint


def create_app(url: str, tokenizer: str | None = None, hosts: list[str] | None = None) -> Starlette:
    """The ui over the store at `url`; requests must name one of `hosts` (loopback names by
    default), so a web page elsewhere cannot reach it through DNS rebinding."""
    source = StoreSource(url)
    queries = Queries(source)
    pages = Pages(queries, Decoder(tokenizer), source)
    routes = [
        Route("/", _handled(pages, pages.runs)),
        Route("/runs/{run_id:path}", _handled(pages, pages.run)),
        Route("/rollouts", _handled(pages, pages.rollouts)),
        Route("/rollouts/{rollout_id}", _handled(pages, pages.rollout)),
        Route("/compare", _handled(pages, pages.compare)),
        Route("/sql", _handled(pages, pages.sql)),
        Mount("/static", StaticFiles(packages=[("rlbus.ui", "static")]), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            queries.close()
            source.close()

    return Starlette(
        routes=routes,
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts or LOCAL_HOSTS)],
        lifespan=lifespan,
    )

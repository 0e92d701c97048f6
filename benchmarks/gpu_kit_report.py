"""The GPU kit's markdown table and closing summary, from OUT/gpu_kit.json's record (benchmarks/gpu_kit.py).

Errors are (predicted − measured) / measured, as in benchmarks/gpu_suite.py; memory in GiB.
"""

from __future__ import annotations

from typing import Any


def _gib(b: Any) -> str:
    return "–" if not isinstance(b, int | float) else f"{b / 2**30:.2f}"


def _pct(x: Any) -> str:
    return "–" if not isinstance(x, int | float) else f"{x:+.1%}"


def _num(x: Any, fmt: str = ",.0f") -> str:
    return "–" if not isinstance(x, int | float) else format(x, fmt)


def _count(n: Any) -> str:
    if not isinstance(n, int | float):
        return "–"
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def _cell(x: Any) -> str:
    return str(x).replace("|", "/").replace("\n", " ")


def step_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The compiled and eager step records, in the order they ran."""
    out = []
    for t in result["tasks"]:
        kind = t["task"].split(":")[0]
        if kind in ("compiled", "eager"):
            out.append({"task": t["task"], "status": t.get("status"), **(t.get("result") or {})})
    return out


def compile_gains(result: dict[str, Any]) -> list[tuple[str, float, float, float, str]]:
    """(model, compiled tokens/s, eager tokens/s, gain, note) where both steps were measured."""
    rows = {r["task"]: r for r in step_rows(result)}
    out = []
    for name, c in rows.items():
        if not name.startswith("compiled:"):
            continue
        e = rows.get("eager:" + name.split(":", 1)[1])
        if not e or not c.get("compile") or e.get("compile") or not c.get("tokens_per_sec") or not e.get("tokens_per_sec"):
            continue
        note = "" if c.get("device_batch_size") == e.get("device_batch_size") else (
            f"eager at micro-batch {e.get('device_batch_size')}, compiled at {c.get('device_batch_size')}")
        out.append((str(c.get("model")), c["tokens_per_sec"], e["tokens_per_sec"],
                    c["tokens_per_sec"] / e["tokens_per_sec"], note))
    return out


def _head(result: dict[str, Any]) -> list[str]:
    env = result.get("env") or {}
    dev = env.get("device") or {}
    pk = env.get("packages") or {}
    device = (f"{dev.get('name')}, {_gib(dev.get('total_memory'))} GiB, {dev.get('multiprocessors')} SMs, "
              f"capability {dev.get('capability')}" if dev else "no CUDA device (CPU mode)")
    pyd = pk.get("pydantic") or {}
    lines = [f"# GPU kit: {dev.get('name') or 'CPU'}"
             + (f" ({result['config'].get('profile')})" if result["config"].get("profile") else "") + f", {result['date']}",
             "", "| | |", "|---|---|",
             f"| device | {device} |",
             f"| driver | {dev.get('smi_driver', '–')} |",
             f"| torch | {env.get('torch', '–')} (CUDA runtime {env.get('cuda_runtime') or '–'}) |",
             f"| Python | {env.get('python', '–')} |",
             f"| pydantic | {pyd.get('version') or 'missing'}{' (carried wheel)' if pyd.get('carried') else ''} |",
             f"| commit | {env.get('commit') or '–'} |",
             f"| date | {result.get('start', result['date'])} |",
             f"| mode | {result['mode']}; wall {_num(result.get('wall_s'), '.0f')} s |",
             f"| results | `{result.get('results_dir', '')}` |"]
    problems = list(env.get("requirement_problems") or [])
    problems += [f"torch lacks {k}" for k, v in (env.get("torch_apis") or {}).items() if not v]
    problems += [f"import {k}: {v}" for k, v in (env.get("project_imports") or {}).items() if v != "ok"]
    if problems or result.get("notes"):
        lines += ["", *[f"- {p}" for p in [*result.get("notes", []), *problems]]]
    return lines


def _tasks(result: dict[str, Any]) -> list[str]:
    lines = ["", "## Tasks", "", "| task | limit s | wall s | status |", "|---|---:|---:|---|"]
    for t in result["tasks"]:
        lines.append(f"| {t['task']} | {_num(t.get('limit_s'), '.0f')} | {_num(t.get('wall_s'), '.1f')} "
                     f"| {_cell(t.get('status'))} |")
    return lines


def _steps(result: dict[str, Any]) -> list[str]:
    rows = step_rows(result)
    if not rows:
        return []
    cfg = result["config"]
    lines = ["", "## (a) compiled step and (d) eager step", "",
             f"The runner's step (benchmarks/gpu_suite.py) at the planner's micro-batch, grad accum 1, AdamW, "
             f"{cfg['warmup']} warm-up + {cfg['steps']} timed steps, synthetic tokens. Errors are (predicted − "
             "measured) / measured; memory in GiB; allocated and reserved are the peaks over the timed steps.", "",
             "| task | model | params | batch | step | status | tok/s pred | tok/s meas | err | alloc pred | alloc meas "
             "| err | reserved pred | reserved meas | err | device used pred | used meas | err | compile+1st step s |",
             "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    if result["mode"] == "cpu" and not cfg.get("cpu_compile"):
        lines[4:4] = ["", "CPU mode: torch.compile is off in both (--cpu-compile turns it on for compiled:tiny)."]
    for r in rows:
        kind = "compiled" if r.get("compile") else "eager"
        lines.append(
            f"| {r['task']} | {r.get('model', '–')} | {_count(r.get('n_params'))} | {r.get('device_batch_size', '–')} "
            f"| {kind} "
            f"| {_cell(r.get('status'))} | {_num(r.get('predicted_tokens_per_sec'))} | {_num(r.get('tokens_per_sec'))} "
            f"| {_pct(r.get('tokens_per_sec_error'))} | {_gib(r.get('predicted_allocated_bytes'))} "
            f"| {_gib(r.get('max_memory_allocated'))} | {_pct(r.get('allocated_error'))} "
            f"| {_gib(r.get('predicted_reserved_bytes'))} | {_gib(r.get('max_memory_reserved'))} "
            f"| {_pct(r.get('reserved_error'))} | {_gib(r.get('predicted_memory_bytes'))} "
            f"| {_gib(r.get('device_used_bytes'))} | {_pct(r.get('device_used_error'))} "
            f"| {_num(r.get('compile_and_first_step_s'), '.1f')} |")
    for model, c, e, gain, note in compile_gains(result):
        lines.append(f"\nCompile gain, {model}: {c:,.0f} / {e:,.0f} tokens/s = {gain:.2f}×" + (f" ({note})" if note else ""))
    return lines


def _probe(result: dict[str, Any]) -> list[str]:
    t = next((t for t in result["tasks"] if t["task"] == "probe"), None)
    if t is None:
        return []
    rec = t.get("result") or {}
    rep = rec.get("report") or {}
    lines = ["", f"## (b) nanoplan probe on the {rec.get('model', 'd20')} plan", "",
             f"Status: {_cell(t.get('status'))}; exit code {rec.get('exit_code', '–')}, "
             f"{_num(rec.get('wall_s'), '.0f')} s; chosen {rep.get('chosen') or '–'} ({_cell(rep.get('reason') or '–')})."]
    trials = rep.get("trials") or []
    if trials:
        lines += ["", "| trial | role | status | tok/s pred | tok/s meas | err | memory pred | peak meas | err |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|"]
        for tr in trials:
            p, m, err = tr.get("predicted") or {}, tr.get("measured") or {}, tr.get("error") or {}
            lines.append(f"| {tr.get('label')} | {tr.get('role')} | {_cell(tr.get('status'))} "
                         f"| {_num(p.get('tokens_per_sec'))} | {_num(m.get('tokens_per_sec'))} "
                         f"| {_pct(err.get('tokens_per_sec'))} | {_gib(p.get('memory_bytes'))} "
                         f"| {_gib(m.get('peak_device_bytes'))} | {_pct(err.get('memory'))} |")
    return lines


def _run(result: dict[str, Any]) -> list[str]:
    t = next((t for t in result["tasks"] if t["task"] == "run"), None)
    if t is None:
        return []
    rec = t.get("result") or {}
    lines = ["", "## (c) nanoplan run: checkpoint, stop, resume", "",
             f"Status: {_cell(t.get('status'))}; a {rec.get('hours', '–')} h plan, launch 1 stopped by SIGINT, "
             "launch 2 resumed and ran to the plan's end.", "", "| check | |", "|---|---|"]
    lines += [f"| {k} | {'yes' if v else '**no**'} |" for k, v in (rec.get("checks") or {}).items()]
    launches = rec.get("launches") or []
    if launches:
        lines += ["", "| launch | exit | stop | at step | checkpoint | wall s |", "|---:|---:|---|---:|---|---:|"]
        for i, la in enumerate(launches, 1):
            st = la.get("stop") or {}
            ck = str(st.get("checkpoint") or "–").rsplit("/", 1)[-1]
            lines.append(f"| {i} | {la.get('exit_code')} | {st.get('reason', '–')} | {st.get('step', '–')} "
                         f"| {ck} | {_num(la.get('wall_s'), '.1f')} |")
    segs = rec.get("segments") or []
    if segs:
        lines += ["", "| segment | steps | median tok/s | peak alloc GiB | peak reserved GiB | device | compiled |",
                  "|---:|---|---:|---:|---:|---|---|"]
        for s in segs:
            lines.append(f"| {s['segment']} | {s['first_step']}–{s['last_step']} | {_num(s['median_tokens_per_sec'])} "
                         f"| {_gib(s['max_memory_allocated'])} | {_gib(s['max_memory_reserved'])} | {s['device']} "
                         f"| {s['compiled']} |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    return "\n".join([*_head(result), *_tasks(result), *_steps(result), *_probe(result), *_run(result)]) + "\n"


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The short table printed last (the device tool returns the end of the output)."""
    env = result.get("env") or {}
    dev = (env.get("device") or {}).get("name") or "CPU"
    out = ["", f"GPU kit: {dev}, torch {env.get('torch', '?')}, {result['mode']} mode, "
               f"{result.get('wall_s', 0):.0f} s"]
    for t in result["tasks"]:
        r = t.get("result") or {}
        line = f"  {t['task']:<13} {str(t.get('status'))[:62]}"
        if r.get("tokens_per_sec"):
            line += f"  {r['tokens_per_sec']:,.0f} tok/s (plan {r.get('predicted_tokens_per_sec', 0):,.0f})"
            if r.get("max_memory_allocated"):
                line += (f"  {_gib(r['max_memory_allocated'])}/{_gib(r.get('max_memory_reserved'))} GiB "
                         "alloc/reserved")
        out.append(line)
    for model, _c, _e, gain, _note in compile_gains(result):
        out.append(f"  compile gain {model}: {gain:.2f}x")
    out.append(f"results: gpu_kit.json, gpu_kit.md, gpu_kit.log -> commit under {result.get('results_dir')}/")
    return out

"""The hot modules compiled by mypyc (common/native.py) against plain Python: the same
runs.json byte for byte for one seed, the compiled modules really the ones loaded, and a
source edited after the build never run as the old machine code."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from common import native

RUN = ["run", "--engine", "sim", "--fabric", "2to1", "--steps", "2", "--byte-scale", "64"]
RUN += ["--policy", "forgive", "--seed", "1"]
SCRIPT = (
    "import json, sys\n"
    "from common import native\n"
    "from commands.forgive import main\n"
    "status = main(sys.argv[1:])\n"
    "print(json.dumps(native.loaded()))\n"
    "sys.exit(status)\n"
)
"""One simulated run in a fresh process (the build is chosen once per process), then which
of the compiled modules it ran compiled."""


def simulate(out, pure: bool) -> dict[str, bool]:
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    env["PYTHONPATH"] = str(native.ROOT)  # this checkout, and so its own build
    if pure:
        env[native.PURE_ENV] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *RUN, "--out", str(out)],
        cwd=native.ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_compiled_and_the_plain_path_write_the_same_runs_json(tmp_path, monkeypatch):
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    status = native.build_status()
    if status == "absent":
        pytest.skip("no compiled build in this checkout (`make setup` makes one)")
    assert status == "current", f"the compiled build is stale: {status}; run `make setup`"
    plain = simulate(tmp_path / "plain", pure=True)
    compiled = simulate(tmp_path / "compiled", pure=False)
    assert sorted(plain) == sorted(compiled) and len(compiled) >= 8
    assert not any(plain.values()), f"FORGIVE_PURE=1 still ran compiled code: {plain}"
    assert all(compiled.values()), f"a current build was not used: {compiled}"
    ran = (tmp_path / "compiled" / "runs.json").read_bytes()
    assert ran == (tmp_path / "plain" / "runs.json").read_bytes()
    records = sorted(
        p.relative_to(tmp_path / "plain") for p in (tmp_path / "plain").rglob("*.jsonl")
    )
    assert records, "the run wrote no records"
    for name in records:  # every host's and rank's records too, not only the summary
        assert (tmp_path / "compiled" / name).read_bytes() == (
            tmp_path / "plain" / name
        ).read_bytes(), name
    assert json.loads(ran)[0]["trims"] > 0  # the run went through trimming and forgiveness


def test_an_edited_source_runs_as_plain_python(tmp_path, monkeypatch):
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    manifest = tmp_path / "manifest.json"
    hashes = native.source_hashes()
    edited = native.COMPILED[0]
    hashes[edited] = "0" * 64
    manifest.write_text(json.dumps({"cache_tag": sys.implementation.cache_tag, "sources": hashes}))
    monkeypatch.setattr(native, "MANIFEST", manifest)
    assert (
        native.build_status()
        == f"{native.source_path(edited).relative_to(native.ROOT)} changed since the build"
    )
    monkeypatch.setattr(
        sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, native._CompiledFinder)]
    )
    with pytest.warns(RuntimeWarning, match="changed since the build"):
        assert native.install() is False
    assert not any(isinstance(f, native._CompiledFinder) for f in sys.meta_path)
    monkeypatch.setenv(native.PURE_ENV, "1")
    assert native.build_status() == "pure"


def test_a_finished_build_is_kept_by_its_sources_and_taken_by_a_fresh_checkout(
    tmp_path, monkeypatch
):
    """The build cache: what one checkout compiled, another of the same sources copies; an
    entry cut short (no manifest) is never taken, and other sources name another entry."""
    pytest.importorskip("mypy")
    first, second = tmp_path / "one" / "native", tmp_path / "two" / "native"
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(native.PURE_ENV, raising=False)

    def use(build_dir):
        monkeypatch.setattr(native, "BUILD_DIR", build_dir)
        monkeypatch.setattr(native, "MANIFEST", build_dir / "manifest.json")

    use(first)  # a checkout that compiled: every extension and its manifest
    for m in (*native.COMPILED, native.GROUP + "__mypyc"):
        path = native._extension(m)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(m.encode())
    native.MANIFEST.write_text(json.dumps(
        {"cache_tag": sys.implementation.cache_tag, "sources": native.source_hashes()}
    ))  # fmt: skip
    assert native.build_status() == "current"
    cached = native._cache_dir()
    native._to_cache(cached)

    use(second)  # a fresh checkout of the same sources
    assert native.build_status() == "absent"
    assert native._from_cache(cached) and native.build_status() == "current"
    for m in native.COMPILED:
        assert native._extension(m).read_bytes() == m.encode()

    (cached / "manifest.json").unlink()  # an entry cut short
    use(tmp_path / "three" / "native")
    assert not native._from_cache(cached) and native.build_status() == "absent"
    monkeypatch.setattr(native, "source_hashes", lambda: {m: "edited" for m in native.COMPILED})
    assert native._cache_dir() != cached
    monkeypatch.setenv(native.CACHE_ENV, "")
    assert native._cache_dir() is None

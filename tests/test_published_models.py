"""Published models as users fetch them: the seven official checkpoints in the registry, how
figshare really answers (202 pages, empty and HTML bodies, short bodies, redirects), every
checkpoint layout the official loader reads, and models trained without magnetic moments.

Only 127.0.0.1 is contacted; every test has its own cache folder.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.calculator import PropertyNotImplementedError
from ase.io import read

from matris import MatRIS, MatRISCalculator, MatRISConfig
from matris import pretrained as pt
from matris.cli import main
from matris.errors import CheckpointError, DownloadError, MatRISInputError, OfflineError, VerificationError
from matris.pretrained import transfer

TINY = dict(num_layers=1, node_feat_dim=8, edge_feat_dim=8, three_body_feat_dim=8, mlp_hidden_dims=(8,))
OFFICIAL = {  # official key → (our name, figshare file id, targets), from the official 1.0.0 README
    "matris_10m_omat": ("matris-10m-omat", 69575544, "efs"),
    "matris_10m_oam": ("matris-10m-oam", 59142728, "efsm"),
    "matris_10m_mp": ("matris-10m-mp", 59143058, "efsm"),
    "matris_4m_matpes_pbev1": ("matris-4m-matpes-pbe-v1", 69575532, "efs"),
    "matris_4m_matpes_pbev2": ("matris-4m-matpes-pbe-v2", 69575535, "efs"),
    "matris_4m_matpes_r2scanv1": ("matris-4m-matpes-r2scan-v1", 69575538, "efs"),
    "matris_4m_matpes_r2scanv2": ("matris-4m-matpes-r2scan-v2", 69576381, "efs"),
}


# ------------------------------------------------------------------------------------ the server
class ScriptedServer:
    """HTTP on 127.0.0.1 answering each path from a script: a list of answers
    ``(status, headers, body)`` used in turn, the last one repeated. ``headers`` may set a
    Content-Length larger than the body (a short body: the connection is closed)."""

    def __init__(self):
        self.scripts: dict[str, list[tuple[int, dict, bytes]]] = {}
        self.hits: dict[str, int] = {}
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.answer(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{path.lstrip('/')}"

    def answer(self, h: BaseHTTPRequestHandler) -> None:
        with self.lock:
            k = self.hits.get(h.path, 0)
            self.hits[h.path] = k + 1
        script = self.scripts.get(h.path)
        if not script:
            h.send_error(404, "not found")
            return
        status, headers, body = script[min(k, len(script) - 1)]
        h.send_response(status)
        headers = {"Content-Length": str(len(body)), **headers}
        for key, value in headers.items():
            h.send_header(key, value)
        h.end_headers()
        h.wfile.write(body)
        if int(headers["Content-Length"]) != len(body):
            h.close_connection = True

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


CHALLENGE = (202, {"Content-Type": "text/html"}, b"<!DOCTYPE html><html><body>Checking your browser</body></html>")


def ok(data: bytes) -> tuple[int, dict, bytes]:
    return 200, {"Content-Type": "application/octet-stream"}, data


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory):
    torch.manual_seed(0)
    return MatRIS(MatRISConfig(**TINY)).save(tmp_path_factory.mktemp("ckpt") / "tiny.pth.tar").read_bytes()


@pytest.fixture
def server():
    srv = ScriptedServer()
    yield srv
    srv.close()


@pytest.fixture(autouse=True)
def few_retries(monkeypatch):
    monkeypatch.setattr(transfer, "DEFAULTS", transfer.DownloadSettings(retries=3, timeout=10, backoff=0))


@pytest.fixture
def entry(server, cache):
    """A registry entry whose file lives on the scripted server at /m.pth.tar."""
    e = pt.register(pt.ModelEntry(name="test-fig", url=server.url("m.pth.tar"), filename="Test_Fig.pth.tar"))
    yield e
    pt.unregister(e.name)


def files_in(folder):
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def no_model_files(folder) -> bool:
    """Nothing but locks and the (empty) hash records: no checkpoint, partial or 0-byte file."""
    return all(name.endswith(".lock") or name == "checksums.json" for name in files_in(folder))


# ------------------------------------------------------------------------------ figshare answers
def test_202_then_the_file(entry, server, tiny_bytes, cache):
    server.scripts["/m.pth.tar"] = [CHALLENGE, ok(tiny_bytes)]
    path = pt.resolve("test-fig")
    assert path == cache / "models" / "Test_Fig.pth.tar" and path.read_bytes() == tiny_bytes
    assert server.hits["/m.pth.tar"] == 2


def test_202_forever_is_a_clear_error_and_caches_nothing(entry, server, cache):
    server.scripts["/m.pth.tar"] = [CHALLENGE]
    with pytest.raises(DownloadError) as info:  # the download's settings are MatRIS.load's argument
        MatRIS.load("test-fig", download=pt.DownloadSettings(retries=3, backoff=0))
    msg = str(info.value)
    assert "HTTP 202" in msg and server.url("m.pth.tar") in msg and "4 attempts in a row failed" in msg
    assert str(cache / "models" / "Test_Fig.pth.tar") in msg and "MATRIS_OFFLINE=1" in msg and "by hand" in msg
    assert server.hits["/m.pth.tar"] == 4
    assert no_model_files(cache)


@pytest.mark.parametrize("answer", [
    (200, {"Content-Type": "text/html; charset=utf-8"}, b"<html><body>Please enable JavaScript</body></html>"),
    (200, {"Content-Type": "application/octet-stream"}, b"\n  <!doctype html><html>a login page</html>"),
    (200, {"Content-Type": "application/octet-stream"}, b""),
    (204, {}, b""),
], ids=["html-type", "html-sniffed", "empty-200", "204"])
def test_pages_and_empty_bodies_are_retried_never_cached(entry, server, tiny_bytes, cache, answer):
    server.scripts["/m.pth.tar"] = [answer, answer, ok(tiny_bytes)]
    assert pt.resolve("test-fig").read_bytes() == tiny_bytes
    assert server.hits["/m.pth.tar"] == 3
    server.scripts["/m.pth.tar"] = [answer]
    with pytest.raises(DownloadError, match="HTML|empty body|HTTP 204"):
        pt.resolve("test-fig", force=True)
    assert no_model_files(cache)


def test_short_body_is_retried(entry, server, tiny_bytes, cache):
    short = (200, {"Content-Length": str(len(tiny_bytes))}, tiny_bytes[:1000])
    server.scripts["/m.pth.tar"] = [short, ok(tiny_bytes)]
    assert pt.resolve("test-fig").read_bytes() == tiny_bytes
    server.scripts["/m.pth.tar"] = [short]
    with pytest.raises(DownloadError, match=f"closed after 1000 of {len(tiny_bytes)} bytes"):
        pt.resolve("test-fig", force=True)
    assert not (cache / "models" / "Test_Fig.pth.tar").exists()


def test_redirect_to_the_storage_host_is_followed(entry, server, tiny_bytes, cache):
    server.scripts["/m.pth.tar"] = [(302, {"Location": "/storage/blob?token=1"}, b"")]
    server.scripts["/storage/blob?token=1"] = [ok(tiny_bytes)]
    assert pt.resolve("test-fig").read_bytes() == tiny_bytes
    assert server.hits["/storage/blob?token=1"] == 1


def test_mirror_is_used_when_the_primary_keeps_failing(server, tiny_bytes, cache, capsys):
    e = pt.register(pt.ModelEntry(name="test-mirrored", url=server.url("fig"), mirrors=(server.url("gh"),)))
    try:
        server.scripts["/fig"] = [CHALLENGE]
        server.scripts["/gh"] = [ok(tiny_bytes)]
        assert pt.resolve("test-mirrored").read_bytes() == tiny_bytes
        assert f"trying {server.url('gh')}" in capsys.readouterr().err
        server.scripts["/gh"] = [(404, {}, b"gone")]
        with pytest.raises(DownloadError) as info:
            pt.resolve("test-mirrored", force=True)
        msg = str(info.value)
        assert "any of its 2 URLs" in msg and "HTTP 202" in msg and "HTTP 404" in msg and "by hand" in msg
    finally:
        pt.unregister(e.name)


def test_published_size_and_sha256_are_checked(server, tiny_bytes, cache):
    import hashlib

    good = hashlib.sha256(tiny_bytes).hexdigest()
    e = pt.register(pt.ModelEntry(name="test-pinned", url=server.url("p"), size=len(tiny_bytes), sha256=good))
    try:
        bad = tiny_bytes[:-1] + bytes([tiny_bytes[-1] ^ 1])  # same size, other bytes
        server.scripts["/p"] = [ok(bad)]
        with pytest.raises(VerificationError) as info:
            pt.resolve("test-pinned")
        msg = str(info.value)
        assert "sha256 mismatch" in msg and good in msg and hashlib.sha256(bad).hexdigest() in msg
        assert no_model_files(cache)
        server.scripts["/p"] = [ok(tiny_bytes + b"x")]
        with pytest.raises(VerificationError, match=f"expected {len(tiny_bytes):,} bytes, got {len(tiny_bytes) + 1:,}"):
            pt.resolve("test-pinned")
        assert no_model_files(cache)
        server.scripts["/p"] = [ok(tiny_bytes)]
        assert pt.resolve("test-pinned").read_bytes() == tiny_bytes
    finally:
        pt.unregister(e.name)


def test_file_fetched_by_hand_is_used_offline(entry, server, tiny_bytes, cache, monkeypatch):
    """What the download error tells a user to do works: the file, under the name the error
    gives, in the cache, with MATRIS_OFFLINE=1."""
    monkeypatch.setenv("MATRIS_OFFLINE", "1")
    with pytest.raises(OfflineError, match="Test_Fig.pth.tar"):
        MatRIS.load("test-fig")
    (cache / "models").mkdir(parents=True)
    (cache / "models" / "Test_Fig.pth.tar").write_bytes(tiny_bytes)
    assert MatRIS.load("test-fig").config.num_layers == 1
    assert server.hits == {}


# ---------------------------------------------------------------------------------- the registry
@pytest.mark.parametrize("key", sorted(OFFICIAL))
def test_every_published_model_resolves_by_official_key_and_our_name(key):
    name, figshare_id, targets = OFFICIAL[key]
    for spelling in (key, key.upper(), name, name.replace("-", "_").upper()):
        assert pt.get_entry(spelling).name == name
    e = pt.get_entry(key)
    assert e.official_key == key and e.figshare_id == figshare_id and e.targets == targets
    assert e.url == f"https://api.figshare.com/v2/file/download/{figshare_id}"
    assert e.mirrors == (f"https://github.com/HPC-AI-Team/MatRIS/releases/download/v1.0.0/{e.filename}",)
    assert e.functional == ("r2SCAN" if "r2scan" in name else "PBE" if "matpes" in name else "PBE/PBE+U")
    assert e.license == "BSD-3-Clause" and e.training_data


def test_only_published_facts_are_pinned():
    oam = pt.get_entry("matris-10m-oam")
    assert oam.size == 42_273_174
    assert oam.sha256 == "c033abc53601a74f10d9b7fec0f658220c013c3b11d4d405f1d32136d4c2b067"
    others = [pt.get_entry(k) for k in OFFICIAL if k != "matris_10m_oam"]
    assert all(e.sha256 is None and e.size is None and e.num_params is None for e in others)


def test_cli_models_json_lists_seven_published_and_the_bundled(cache, capsys, monkeypatch):
    import matris.cli

    monkeypatch.setattr(matris.cli, "SUBCOMMANDS", {"models": matris.cli.SUBCOMMANDS["models"]})
    assert main(["models", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)["models"]
    published = [m for m in models if m["status"] != "bundled"]
    assert [m["name"] for m in models if m["status"] == "bundled"] == ["matris-demo"]
    assert sorted(m["official_key"] for m in published) == sorted(OFFICIAL)
    for m in published:
        assert m["url"].startswith("https://api.figshare.com/v2/file/download/")
        assert m["targets"] in ("efs", "efsm") and m["functional"] and m["mirrors"]


# ---------------------------------------------------------------------------------------- layouts
@pytest.fixture(scope="module")
def ref_model():
    """A tiny float64 model with 94 reference energies (the last five zero, so a width-89
    copy of the same weights gives the same energies on structures without Th..Pu)."""
    torch.manual_seed(1)
    model = MatRIS(MatRISConfig(**TINY, reference_energy="fitted")).double()
    with torch.no_grad():
        w = torch.linspace(-9.0, -1.0, 94, dtype=torch.float64)
        w[89:] = 0.0
        model.reference_energy.fc.weight.copy_(w.reshape(1, -1))
    return model


def plain(model) -> dict:
    return model.checkpoint_state(torch.float64)


def energies(model, structures):
    return np.array([p.energy for p in model.double().predict(structures)])


STRUCTURES = [bulk("Si", "diamond", a=5.43), bulk("NaCl", "rocksalt", a=5.6), bulk("Ac", "fcc", a=5.3)]


def plain_energies(ref_model, tmp_path, structures=STRUCTURES):
    """Energies of ``ref_model`` loaded from the plain published layout."""
    return energies(MatRIS.load(ref_model.save(tmp_path / "plain.pth.tar"), dtype=torch.float64), structures)


def test_nested_layout_and_legacy_key_load_with_the_same_numbers(ref_model, tmp_path):
    expected = plain_energies(ref_model, tmp_path)
    state = plain(ref_model)
    torch.save({"model": {"config": state["config"], "state_dict": state["state_dict"]}, "epoch": 7,
                "optimizer": {"lr": 1e-3}}, tmp_path / "nested.pth.tar")
    legacy = dict(state["state_dict"])
    legacy["composition_model.fc.weight"] = legacy.pop("reference_energy.fc.weight")
    torch.save({"config": state["config"], "state_dict": legacy}, tmp_path / "legacy.pth.tar")
    both = dict(legacy, **{"reference_energy.fc.weight": legacy["composition_model.fc.weight"].clone()})
    torch.save({"config": state["config"], "state_dict": both}, tmp_path / "both-equal.pth.tar")
    for name in ("nested", "legacy", "both-equal"):
        model = MatRIS.load(tmp_path / f"{name}.pth.tar", dtype=torch.float64)
        np.testing.assert_allclose(energies(model, STRUCTURES), expected, rtol=1e-13, err_msg=name)
        saved = torch.load(model.save(tmp_path / f"{name}-resaved.pth.tar", torch.float64), weights_only=True)
        assert set(saved) == {"config", "state_dict", "targets"}  # the plain published layout
        assert "composition_model.fc.weight" not in saved["state_dict"]
    assert pt.verify_checkpoint(tmp_path / "nested.pth.tar")  # downloads of these layouts verify too


def test_conflicting_reference_keys_are_a_clear_error(ref_model, tmp_path):
    state = plain(ref_model)
    sd = dict(state["state_dict"])
    sd["composition_model.fc.weight"] = sd["reference_energy.fc.weight"] + 0.1
    torch.save({"config": state["config"], "state_dict": sd}, tmp_path / "conflict.pth.tar")
    with pytest.raises(CheckpointError, match="two different reference energies.*composition_model.fc.weight"):
        MatRIS.load(tmp_path / "conflict.pth.tar")
    with pytest.raises(VerificationError, match="two different reference energies"):
        pt.verify_checkpoint(tmp_path / "conflict.pth.tar")


def test_reference_width_89(ref_model, tmp_path):
    state = plain(ref_model)
    sd = dict(state["state_dict"])
    sd["reference_energy.fc.weight"] = sd["reference_energy.fc.weight"][:, :89].clone()
    torch.save({"config": state["config"], "state_dict": sd}, tmp_path / "w89.pth.tar")
    model = MatRIS.load(tmp_path / "w89.pth.tar", dtype=torch.float64)
    assert model.reference_energy.num_elements == 89 and model.max_atomic_number == 89
    np.testing.assert_allclose(energies(model, STRUCTURES), plain_energies(ref_model, tmp_path), rtol=1e-13)

    uranium = bulk("U", "fcc", a=4.6)
    calc = MatRISCalculator(model, dtype="float64")
    for call in (lambda: model.predict([STRUCTURES[0], uranium]), lambda: calc.get_potential_energy(uranium)):
        with pytest.raises(MatRISInputError) as info:
            call()
        msg = str(info.value)
        assert "contains U" in msg and "w89.pth.tar" in msg and "Z = 1..89" in msg and "Ac" in msg
    assert calc.get_potential_energy(STRUCTURES[0].copy()) == pytest.approx(plain_energies(ref_model, tmp_path)[0],
                                                                            rel=1e-13)
    resaved = MatRIS.from_checkpoint(model.save(tmp_path / "w89-again.pth.tar", torch.float64))
    assert resaved.reference_energy.num_elements == 89


def test_shape_mismatch_is_a_checkpoint_error(ref_model, tmp_path):
    state = plain(ref_model)
    state["config"]["node_feat_dim"] = 16  # the weights are width 8
    torch.save(state, tmp_path / "bad.pth.tar")
    with pytest.raises(CheckpointError, match="does not match its config"):
        MatRIS.load(tmp_path / "bad.pth.tar")


# ------------------------------------------------------------------------- models without magmoms
@pytest.fixture(scope="module")
def efs_file(tmp_path_factory):
    """A model trained on e, f, s only, saved with its targets."""
    torch.manual_seed(2)
    model = MatRIS(MatRISConfig(**TINY))
    model.targets = "efs"
    return model.save(tmp_path_factory.mktemp("efs") / "efs.pth.tar")


def test_efs_model_offers_no_magmoms(efs_file, tmp_path, cache, capsys):
    model = MatRIS.load(efs_file)
    assert model.targets == "efs" and not model.predicts_magmoms
    si = bulk("Si", "diamond", a=5.43)
    assert model.predict(si).magmoms is None
    assert model.predict(si, compute_magmoms=True).magmoms is not None  # the head, when asked explicitly
    atoms = si.copy()
    atoms.calc = MatRISCalculator(model)
    assert "magmoms" not in atoms.calc.implemented_properties
    assert np.isfinite(atoms.get_potential_energy()) and atoms.get_forces().shape == (2, 3)
    with pytest.raises(PropertyNotImplementedError):
        atoms.get_magnetic_moments()
    full = MatRISCalculator(MatRIS.load(efs_file, targets="efsm"))
    atoms.calc = full
    assert atoms.get_magnetic_moments().shape == (2,)

    si.write(tmp_path / "si.cif")
    assert main(["predict", str(tmp_path / "si.cif"), "--model", str(efs_file)]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("si ")][0]
    assert row.rstrip().endswith("–")
    assert main(["predict", str(tmp_path / "si.cif"), "--model", str(efs_file), "--json", str(tmp_path / "p.json"),
                 "--quiet"]) == 0
    assert json.loads((tmp_path / "p.json").read_text())[0]["magmoms"] is None


def test_efs_model_runs_relax_md_and_torch_sim(efs_file, tmp_path):
    from matris.simulate import md, relax

    model = MatRIS.load(efs_file, dtype=torch.float64)
    atoms = bulk("Si", "diamond", a=5.43)
    atoms.rattle(0.02, seed=0)
    start = MatRISCalculator(model).get_potential_energy(atoms.copy())
    r = relax(atoms, model=model, steps=5, trajectory=tmp_path / "r.extxyz")
    assert np.isfinite(r.energy) and r.energy <= start + 1e-9  # the relaxation went down
    m = md(atoms, model=model, steps=4, loginterval=2, trajectory=tmp_path / "md.traj")
    assert m.steps == 4 and [row["step"] for row in m.log] == [0, 2, 4]
    assert np.all(np.isfinite(m.column("total_energy"))) and len(read(tmp_path / "md.traj", ":")) == 3
    pytest.importorskip("torch_sim")
    from matris.simulate import md_batch, relax_batch

    batch = relax_batch([atoms, atoms.copy()], model=model, steps=5)
    assert abs(batch[0].energy - batch[1].energy) < 1e-8 and batch[0].energy <= start + 1e-9
    run = md_batch([atoms], model=model, steps=3, ensemble="nve")
    assert run.steps == 3 and len(run.atoms) == 1 and np.all(np.isfinite(run.column("total_energy")))


def test_targets_of_a_file_that_does_not_say(tmp_path, cache):
    """Official files carry no targets: a registry name, the official file name or a recorded
    download decides; anything else offers magmoms (what the official calculator did)."""
    torch.manual_seed(3)
    state = MatRIS(MatRISConfig(**TINY)).checkpoint_state()
    del state["targets"]
    official = tmp_path / "MatRIS_4M_MatPES_r2SCANv2.pth.tar"
    torch.save(state, official)
    torch.save(state, tmp_path / "mine.pth.tar")
    assert MatRIS.load(official).targets == "efs"
    assert MatRIS.load(tmp_path / "mine.pth.tar").targets == "efsm"
    assert MatRIS.load(tmp_path / "mine.pth.tar", targets="efs").targets == "efs"
    # the same bytes in the cache under the registry's name: the entry decides
    models = cache / "models"
    models.mkdir(parents=True)
    (models / "MatRIS_10M_OMAT.pth.tar").write_bytes(official.read_bytes())
    assert pt.entry_for_file(models / "MatRIS_10M_OMAT.pth.tar").name == "matris-10m-omat"


def test_finetune_matpes_example_prints_its_config_offline(cache, capsys, monkeypatch):
    from pathlib import Path

    import yaml

    monkeypatch.setenv("MATRIS_OFFLINE", "1")
    config = Path(__file__).parents[1] / "examples" / "configs" / "finetune-matpes-r2scan.yaml"
    assert main(["train", "--config", str(config), "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert pt.get_entry(printed["finetune"]["from_checkpoint"]).functional in ("PBE", "r2SCAN", "PBE/PBE+U")
    assert printed["reference_energy"]["mode"] == "refit" and printed["data"]["train"]
    assert main(["train", "--config", str(config), "--print-config", "--data.train", "[my_r2scan.extxyz]"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["data"]["train"] == ["my_r2scan.extxyz"]

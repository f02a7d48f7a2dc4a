"""Where the jax engine keeps compiled executables (VERIGRAD_JAX_CACHE), without JAX itself."""
import pathlib
import types

from reports.conformance.adapters import jax as adapter


class FakeConfig:
    def __init__(self, cache_dir=None):
        self.jax_compilation_cache_dir = cache_dir
        self.updates = {}

    def update(self, name, value):
        self.updates[name] = value
        setattr(self, name, value)


def _fake_jax(cache_dir=None):
    return types.SimpleNamespace(config=FakeConfig(cache_dir))


def test_default_is_under_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(adapter.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert adapter.compilation_cache_dir() == tmp_path / "verigrad" / "jax"
    jax = _fake_jax()
    adapter._use_compilation_cache(jax)
    assert jax.config.updates["jax_compilation_cache_dir"] == str(tmp_path / "verigrad" / "jax")
    assert jax.config.updates["jax_persistent_cache_min_compile_time_secs"] == 0.0
    assert jax.config.updates["jax_compilation_cache_max_size"] == adapter.CACHE_MAX_BYTES
    assert (tmp_path / "verigrad" / "jax").is_dir()


def test_a_chosen_folder_and_off(monkeypatch, tmp_path):
    monkeypatch.setenv(adapter.CACHE_ENV, str(tmp_path / "mine"))
    assert adapter.compilation_cache_dir() == pathlib.Path(tmp_path / "mine")
    for off in ("off", "0", "OFF"):
        monkeypatch.setenv(adapter.CACHE_ENV, off)
        assert adapter.compilation_cache_dir() is None
        jax = _fake_jax()
        adapter._use_compilation_cache(jax)
        assert jax.config.updates == {}


def test_a_program_s_own_cache_is_kept(monkeypatch, tmp_path):
    monkeypatch.delenv(adapter.CACHE_ENV, raising=False)
    jax = _fake_jax(cache_dir="/somewhere/else")
    adapter._use_compilation_cache(jax)
    assert jax.config.updates == {}


def test_an_unwritable_folder_compiles_as_without_a_cache(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(adapter.CACHE_ENV, str(blocker / "jax"))
    jax = _fake_jax()
    adapter._use_compilation_cache(jax)
    assert jax.config.updates == {}

"""Fusion tests write generated kernels to a temporary cache directory, not the user's."""
import pytest


@pytest.fixture(autouse=True, scope="session")
def _fusion_cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("OPFORGE_CACHE_DIR", str(tmp_path_factory.mktemp("opforge-cache")))
    yield
    mp.undo()

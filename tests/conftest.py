from tests.common import data_dir, one_thread  # noqa: F401  (fixtures shared with annex/tests)

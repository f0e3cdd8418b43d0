"""A stand-in for a CPU-only torch build (e.g. `pip install torch` from the CPU index) in the fault tests:
importable, a version, no CUDA. Only what the workbook's checks touch before any GPU work exists here."""
__version__ = "2.11.0+cpu"


class version:  # noqa: N801 - torch.version is a module; an attribute holder is enough here
    cuda = None
    git_version = "fake"


class cuda:  # noqa: N801
    @staticmethod
    def is_available():
        return False

    @staticmethod
    def device_count():
        return 0

    @staticmethod
    def is_initialized():
        return False

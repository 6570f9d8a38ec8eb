# Importing coevo first moves the repository root behind site-packages on sys.path, so that the
# root's kernels/ folder does not shadow Hugging Face's `kernels` package (coevo/__init__.py).
import coevo  # noqa: F401

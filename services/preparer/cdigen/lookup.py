"""Finding driver files under a root the way the toolkit's locators do.

Each function mirrors one of nvidia-container-toolkit's ``pkg/lookup``
locators (file, symlink, library, executable, char device), with the same
search order and the same filters, because the set and order of what they
find is what ends up in the CDI spec.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import stat
from collections.abc import Callable, Iterable, Sequence

from services.preparer.cdigen import ldcache

# The toolkit's fixed library directories (pkg/lookup/library.go), before the ldcache.
LIBRARY_SEARCH_PATHS = (
    "/",
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
)
DEFAULT_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

Filter = Callable[[str], bool]


def join(root: str, path: str) -> str:
    """``filepath.Join(root, path)``: an absolute ``path`` is still put under ``root``."""
    return os.path.normpath(os.path.join(root or ".", path.lstrip("/"))) if path else root


def prefixes(root: str, search_paths: Sequence[str]) -> list[str]:
    """Unique ``root+p`` for each search path; ``[root]`` when there are none."""
    seen: set[str] = set()
    out = []
    for p in search_paths:
        if p not in seen:
            seen.add(p)
            out.append(join(root, p))
    return out or [root]


def is_file(path: str) -> bool:
    """The toolkit's default filter: anything stat can see that is not a directory."""
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


def is_executable(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return not stat.S_ISDIR(st.st_mode) and bool(st.st_mode & 0o111)


def is_char_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.lstat(path).st_mode)
    except OSError:
        return False


def _glob(pattern: str) -> list[str]:
    if not glob.has_magic(pattern):
        return [pattern] if os.path.lexists(pattern) else []
    return sorted(glob.glob(pattern))


def files(
    root: str,
    pattern: str,
    search_paths: Sequence[str] = (),
    accept: Filter = is_file,
    count: int = 0,
) -> list[str]:
    """Every match of ``pattern`` under each search prefix, in order (the file locator)."""
    found: list[str] = []
    for prefix in prefixes(root, search_paths):
        for candidate in _glob(join(prefix, pattern)):
            if accept(candidate):
                found.append(candidate)
                if count and len(found) == count:
                    return found
    return found


def unique(paths: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(paths))


def resolved(paths: Iterable[str]) -> list[str]:
    """Symlinks evaluated (``filepath.EvalSymlinks``), duplicates dropped."""
    return unique(os.path.realpath(p) for p in paths)


def symlinks(root: str, pattern: str, search_paths: Sequence[str]) -> list[str]:
    """The symlink locator: files found, each resolved to its target."""
    return resolved(files(root, pattern, search_paths))


def resolve_chain(path: str) -> list[str]:
    """``path`` and every link on the way to its final target (symlinks.ResolveChain)."""
    chain: list[str] = []
    seen: set[str] = set()
    while path not in seen:
        try:
            is_link = stat.S_ISLNK(os.lstat(path).st_mode)
        except OSError:
            return chain if chain else []
        seen.add(path)
        chain.append(path)
        if not is_link:
            break
        target = os.readlink(path)
        path = (
            target
            if os.path.isabs(target)
            else os.path.abspath(os.path.join(os.path.dirname(path), target))
        )
    return chain


class Libraries:
    """The library locator: fixed search directories under the root, then the ldcache."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._cache: list[str] | None = None

    def _ldcache(self) -> list[str]:
        if self._cache is None:
            chains = [resolve_chain(lib) for lib in ldcache.libraries64(self.root)]
            self._cache = [p for chain in chains for p in chain]
        return self._cache

    def locate(self, pattern: str) -> list[str]:
        found = symlinks(self.root, pattern, LIBRARY_SEARCH_PATHS)
        if found:
            return found
        if "/" in pattern:
            full = join(self.root, pattern)
            matches = [p for p in self._ldcache() if fnmatch.fnmatchcase(p, full)]
        else:
            matches = [
                p for p in self._ldcache() if fnmatch.fnmatchcase(os.path.basename(p), pattern)
            ]
        return resolved(matches)


def executable_dirs(root: str) -> list[str]:
    """``PATH`` then the default directories, those under ``root`` first (lookup.GetPaths)."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    dirs += [d for d in DEFAULT_PATH if d not in dirs]
    if root not in ("", "/"):
        dirs = [os.path.join(root, d.lstrip("/")) for d in dirs] + dirs
    return dirs


def executable(root: str, name: str) -> list[str]:
    """The first executable called ``name`` in the search directories under ``root``."""
    return files(root, name, executable_dirs(root), accept=is_executable, count=1)


def char_devices(dev_root: str, pattern: str) -> list[str]:
    """Char device nodes matching ``pattern`` at ``dev_root`` (searched at / and /dev)."""
    return files(dev_root, pattern, ("/", "/dev"), accept=is_char_device)

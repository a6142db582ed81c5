"""Files a checkpoint carries inside its model part, beside what the model writes.

What a resume needs besides the model (the state of the user's callbacks,
say) can be larger than a sidecar should be (a callback's copy of the best
weights), so it travels inside the model part: as members under
``jupyter_traincontrol/`` of a ``.keras`` file (a zip archive, whose
readers, ``keras.models.load_model`` and ``model.load_weights``, read only
the members they know), or as files in that subfolder of a folder part.
They are written into the staged part before it is renamed into place, so
they are committed with it, whole or not at all.

`Attached` wraps what a save writes (anything with ``save(path)``);
`read_attachment` reads one back.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any, Mapping

__all__ = ["ATTACHMENT_FOLDER", "Attached", "read_attachment"]

#: Where the attachments are, inside a model part.
ATTACHMENT_FOLDER = "jupyter_traincontrol"


class Attached:
    """What a save writes, with files attached to it.

    Any other attribute, read or set, is the wrapped source's (a
    snapshot's step, the pace a writer gives it), so it stands wherever
    the source does.

    Args:
        source: Anything with ``save(path)``: a model, a snapshot.
        files: Attachment names (plain file names) to their content, or to
            functions that return it (called when the part is written, so
            large content is encoded off the training thread).
    """

    def __init__(self, source: Any, files: Mapping[str, Any]):
        for name in files:
            if not name or "/" in name or name.startswith("."):
                raise ValueError(f"An attachment's name must be a plain file name; got {name!r}.")
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "files", dict(files))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.source, name, value)

    def save(self, path) -> None:
        """Writes the source's part at `path`, then the attachments into it.

        Raises:
            ValueError: If the part written is neither a zip archive nor a
                folder (attachments have no place in it).
        """
        self.source.save(path)
        contents = {name: content() if callable(content) else content for name, content in self.files.items()}
        path = Path(path)
        if path.is_dir():
            folder = path / ATTACHMENT_FOLDER
            folder.mkdir(mode=0o700, exist_ok=True)
            for name, content in contents.items():
                _write_new(folder / name, content)
        elif zipfile.is_zipfile(path):
            with zipfile.ZipFile(path, "a") as archive:
                for name, content in contents.items():
                    archive.writestr(f"{ATTACHMENT_FOLDER}/{name}", content)
        else:
            raise ValueError(f"Cannot attach {', '.join(contents)} to {path.name}: the part is neither a zip archive "
                             "(.keras) nor a folder.")


def read_attachment(part: str | os.PathLike, name: str) -> bytes | None:
    """The attachment `name` of model part `part`, or None if it has none
    (a checkpoint written without it, a part of another kind).

    Raises:
        OSError: If the part cannot be read.
    """
    part = Path(part)
    if part.is_dir():
        file = part / ATTACHMENT_FOLDER / name
        return file.read_bytes() if file.is_file() and not file.is_symlink() else None
    if not zipfile.is_zipfile(part):
        return None
    try:
        with zipfile.ZipFile(part) as archive:
            return archive.read(f"{ATTACHMENT_FOLDER}/{name}")
    except KeyError:
        return None
    except zipfile.BadZipFile as error:
        raise OSError(f"{part.name} is not a readable zip archive: {error}") from error


def _write_new(path: Path, content: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)

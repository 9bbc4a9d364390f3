"""The folders a server writes, temporary ones: the model repository Triton loads from (one
folder per bound model, with its version folder and file-based warm-up data, and a link per
model of the user's repositories, which are :mod:`.repositories`) and the backend folder (our
backend library, Triton's log)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..backend.binding import Binding
from ..backend.library import install_backend
from ..config.triton_json import WARMUP_FOLDER, labels_file_name, warmup_file_bytes, warmup_file_name
from ..errors import InvalidArgumentError


class GeneratedRepository:
    """The model repository the server generates at ``path`` (a temporary folder when None) and
    a temporary backend folder, created by :meth:`open` and removed by :meth:`close`."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self.models: Path | None = None
        self.backends: Path | None = None  # our temporary folder (Triton's log goes here too)
        self.backend_dir: Path | None = None  # Triton's backend directory, inside it
        self._own = False

    def open(self) -> None:
        if self._path:
            self.models = Path(self._path)
            self.models.mkdir(parents=True, exist_ok=True)
        else:
            self.models = Path(tempfile.mkdtemp(prefix="embedtriton-models-"))
            self._own = True
        self.backends = Path(tempfile.mkdtemp(prefix="embedtriton-backends-"))
        self.backend_dir = install_backend(self.backends)

    def model_dir(self, name: str) -> Path:
        assert self.models is not None
        return self.models / name

    def write(self, binding: Binding) -> Path:
        """The model's folder, with its version folder and warm-up files."""
        directory = self.model_dir(binding.name)
        try:
            self._write(binding, directory)
        except OSError as exc:
            raise InvalidArgumentError(
                f"cannot write model '{binding.name}' into the model repository {self.models}: {exc.strerror}"
            ) from None
        return directory

    def key(self, binding: Binding) -> str:
        """Where the backend looks the binding up: its version's folder."""
        return str(self.model_dir(binding.name) / str(binding.version))

    def remove_version(self, name: str, version: int) -> None:
        shutil.rmtree(self.model_dir(name) / str(version), ignore_errors=True)

    def _write(self, binding: Binding, directory: Path) -> None:
        folder = directory / str(binding.version)
        folder.mkdir(parents=True, exist_ok=True)
        # which binding the folder serves: a new one (a new callable for a version) is a change
        # Triton sees, so loading the model again reloads that version
        (folder / "binding").write_text(str(id(binding)))
        for index, output in enumerate(binding.outputs):  # Triton's label_filename: one label per line
            if output.labels is not None:
                (directory / labels_file_name(index)).write_text("".join(f"{x}\n" for x in output.labels))
        for stage in binding.config.model_warmup or []:  # file-based warm-up data goes beside the model
            for input_name, spec in stage.inputs.items():
                if spec.input_data_file is not None:
                    folder = directory / WARMUP_FOLDER
                    folder.mkdir(exist_ok=True)
                    (folder / warmup_file_name(stage, input_name)).write_bytes(warmup_file_bytes(spec))

    def remove(self, name: str) -> None:
        shutil.rmtree(self.model_dir(name), ignore_errors=True)

    def close(self, names: list[str]) -> None:
        """Remove the backend folder and what we wrote into the model repository."""
        if self.backends is not None:
            shutil.rmtree(self.backends, ignore_errors=True)
            self.backends = None
        if self.models is not None:
            if self._own:
                shutil.rmtree(self.models, ignore_errors=True)
            else:
                for name in names:
                    shutil.rmtree(self.models / name, ignore_errors=True)
            self.models = None
            self._own = False

"""Files the agent ships beside its code: the probes' C sources and the demo's services.

BCC compiles ``bpf/*.c`` when the agent starts, and ``otelbpf demo`` runs the example
services of ``examples/``. Both are found from the code's own location, so that a
checkout, an editable install and an installed wheel (the image) need nothing set:

1. the override, an environment variable (``OTELBPF_BPF_DIR``, ``OTELBPF_EXAMPLES``);
2. the checkout: the folder beside the ``otelbpf`` package (``<checkout>/bpf``);
3. the installation: ``<prefix>/share/otelbpf/<folder>``, where ``setup.py``'s
   ``data_files`` put them when the package was installed as a wheel.

The first folder that holds the file that marks it wins. When none does, the checkout's
path is returned, so that the error names the place a contributor would look.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

#: The repository (or the folder holding the installed ``otelbpf`` package).
CHECKOUT = Path(__file__).resolve().parents[1]
#: Where ``setup.py`` installs the bundled folders, under the installation's prefix.
SHARE = Path("share") / "otelbpf"


@dataclass(frozen=True)
class Bundled:
    """One folder shipped beside the code."""

    #: Its name in the repository and under ``share/otelbpf``.
    folder: str
    #: The environment variable that overrides where it is.
    env: str
    #: A file that must be in it (a folder without it is not this one).
    marker: str

    def candidates(self) -> list[Path]:
        """Where it is looked for, in order (the override first, when set)."""
        places = [CHECKOUT / self.folder, Path(sys.prefix) / SHARE / self.folder]
        override = os.environ.get(self.env)
        return [Path(override), *places] if override else places

    def locate(self) -> Path:
        """The folder; an override is taken as it is, even where it lacks the marker
        (the user said so: the checks then say that the marker is missing there)."""
        override = os.environ.get(self.env)
        if override:
            return Path(override)
        for place in self.candidates():
            if (place / self.marker).is_file():
                return place
        return CHECKOUT / self.folder

    def hint(self) -> str:
        """What to do when it is not found (for errors and ``otelbpf doctor``)."""
        looked = ", ".join(str(p) for p in self.candidates())
        return f"looked in {looked}; set {self.env} to the folder holding {self.marker}"


#: The probes' C sources, compiled by BCC at start-up.
BPF = Bundled("bpf", "OTELBPF_BPF_DIR", "capture.c")
#: The services ``otelbpf demo`` traces.
EXAMPLES = Bundled("examples", "OTELBPF_EXAMPLES", "http_backend.py")
#: The example services the demo cannot run without (``setup.py`` installs these with the wheel).
DEMO_SERVICES = ("http_backend.py", "http_gateway.py", "grpc_service.py", "openai_mock_server.py")

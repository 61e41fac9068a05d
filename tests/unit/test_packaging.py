"""setup.cfg lists every package, so a wheel (the env-worker image's) holds all the code."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_in_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    roots = dict(
        (part.strip() for part in line.split("="))
        for line in cfg["options"]["package_dir"].splitlines()
        if line.strip()
    )
    found = set()
    for package, folder in roots.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *relative.parts]))
    assert found - listed == set(), "packages missing from setup.cfg [options] packages"
    assert listed - found == set(), "setup.cfg lists packages that do not exist"

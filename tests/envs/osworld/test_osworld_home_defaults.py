"""A fresh desktop home: file types open in Ubuntu's default apps, for those installed here."""

from __future__ import annotations

import configparser

from rz_agents.envs.osworld.providers import home_defaults
from rz_agents.envs.osworld.providers.home_defaults import MIMEAPPS, default_handlers, write_home_defaults


def test_only_installed_handlers_are_named(tmp_path):
    apps = tmp_path / "applications"
    apps.mkdir()
    assert default_handlers(str(apps)) == {}
    (apps / "org.gnome.Evince.desktop").write_text("[Desktop Entry]\n")
    (apps / "org.gnome.Totem.desktop").write_text("[Desktop Entry]\n")
    handlers = default_handlers(str(apps))
    assert handlers["application/pdf"] == "org.gnome.Evince.desktop"
    assert handlers["video/mp4"] == handlers["video/x-matroska"] == "org.gnome.Totem.desktop"
    assert "image/png" not in handlers and "text/plain" not in handlers  # eog, gedit absent


def test_home_gets_a_mimeapps_list_that_xdg_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(
        home_defaults, "default_handlers", lambda: {"application/pdf": "org.gnome.Evince.desktop"}
    )
    write_home_defaults(str(tmp_path))
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str  # MIME types keep their case
    parser.read(tmp_path / MIMEAPPS)
    assert dict(parser["Default Applications"]) == {"application/pdf": "org.gnome.Evince.desktop"}
    monkeypatch.setattr(home_defaults, "default_handlers", dict)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    write_home_defaults(str(fresh))
    assert not (fresh / MIMEAPPS).exists()  # nothing installed: xdg-open chooses as before

"""Image metrics (GIMP, screenshots) and application-settings metrics (GIMP, LibreOffice, Thunderbird,
VLC)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from rz_agents.envs.osworld.metrics import METRICS
from rz_agents.envs.osworld.metrics.images import ssim

M = METRICS


def picture(path, array):
    Image.fromarray(np.asarray(array, dtype=np.uint8)).save(path)
    return str(path)


def scene(seed=0, size=(64, 80)):
    rng = np.random.default_rng(seed)
    base = rng.integers(40, 200, size=(*size, 3))
    base[10:30, 10:40] = (250, 200, 30)  # a block, so structure is more than noise
    return base


def test_ssim_matches_known_values():
    img = scene()[..., 0].astype(np.uint8)
    assert ssim(img, img) == pytest.approx(1.0)
    noisy = np.clip(img.astype(int) + np.random.default_rng(1).integers(-60, 60, img.shape), 0, 255).astype(
        np.uint8
    )
    assert 0.2 < ssim(img, noisy) < 0.9
    with pytest.raises(ValueError, match="shape"):
        ssim(img, img[:-1])


def test_gimp_adjustments_are_recognised(tmp_path):
    base = scene()
    src = picture(tmp_path / "src.png", base)
    darker = picture(tmp_path / "dark.png", base * 0.7)
    assert M["check_brightness_decrease_and_structure_sim"](darker, src) == 1.0
    assert M["check_brightness_decrease_and_structure_sim"](src, darker) == 0.0
    mirrored = picture(tmp_path / "mirror.png", base[:, ::-1])
    assert M["check_image_mirror"](src, mirrored) == 1.0 and M["check_image_mirror"](src, src) == 0.0
    contrast = picture(tmp_path / "contrast.png", np.clip((base - 128) * 1.5 + 128, 0, 255))
    assert M["check_contrast_increase_and_structure_sim"](contrast, src) == 1.0
    assert M["check_contrast_increase_and_structure_sim"](src, contrast) == 0.0
    assert M["check_structure_sim"](src, picture(tmp_path / "copy.png", base)) == 1.0
    assert M["check_structure_sim"](src, picture(tmp_path / "other.png", scene(5))) == 0.0
    Image.open(src).convert("P", palette=Image.Palette.ADAPTIVE).save(tmp_path / "pal.png")
    assert M["check_palette_and_structure_sim"](str(tmp_path / "pal.png"), src) == 1.0
    assert M["check_palette_and_structure_sim"](src, src) == 0.0
    assert M["check_file_exists_and_structure_sim"](str(tmp_path / "missing.png"), src) == 0.0
    assert (
        M["check_image_size"](src, {"height": 64}) == 1.0 and M["check_image_size"](src, {"width": 10}) == 0.0
    )
    assert M["compare_images"](src, src) == pytest.approx(1.0)
    assert M["compare_image_list"]([src], [str(tmp_path / "copy.png")]) == 1.0


def test_saturation_green_background_triangle_and_text_position(tmp_path):
    base = scene()
    grey = base.mean(axis=2, keepdims=True)
    vivid = picture(tmp_path / "vivid.png", np.clip(grey + (base - grey) * 1.6, 0, 255))
    assert M["check_saturation_increase_and_structure_sim"](vivid, picture(tmp_path / "b.png", base)) == 1.0
    mask = np.zeros((40, 40, 3))
    mask[:, :20] = 255  # left half is background
    green = np.zeros((40, 40, 3))
    green[:, :20] = (10, 200, 10)
    assert (
        M["check_green_background"](picture(tmp_path / "g.png", green), picture(tmp_path / "m.png", mask))
        == 1.0
    )
    assert (
        M["check_green_background"](
            picture(tmp_path / "k.png", np.zeros((40, 40, 3))), str(tmp_path / "m.png")
        )
        == 0.0
    )
    # OSWorld picks the second *rarest* colour: here the yellow square (a red dot is rarer).
    canvas = np.full((50, 50, 3), 255)
    canvas[20:30, 20:30] = (250, 250, 0)
    canvas[0, 0] = (255, 0, 0)
    assert M["check_triangle_position"](picture(tmp_path / "t.png", canvas)) == 1.0
    canvas2 = np.full((50, 50, 3), 255)
    canvas2[0:10, 0:10] = (250, 250, 0)
    canvas2[49, 49] = (255, 0, 0)
    assert M["check_triangle_position"](picture(tmp_path / "t2.png", canvas2)) == 0.0
    text = np.full((50, 100, 3), 255)
    text[20:30, 2:40] = 0
    assert M["check_textbox_on_leftside"](picture(tmp_path / "l.png", text)) == 1.0
    assert M["check_textbox_on_leftside"](picture(tmp_path / "r.png", text[:, ::-1])) == 0.0


def write(path, text):
    path.write_text(text)
    return str(path)


def test_gimp_and_libreoffice_settings(tmp_path):
    gimprc = write(
        tmp_path / "gimprc",
        '# GIMP gimprc\n(theme "Light")\n(undo-levels 100)\n(history-item "filters-vignette" 1)\n',
    )
    assert M["check_config_status"](gimprc, {"key": "theme", "value": '"Light"'}) == 1.0
    assert M["check_config_status"](gimprc, {"key": "undo-levels", "value": "5"}) == 0.0
    assert (
        M["check_config_status"](gimprc, {"key": ["history-item", '"filters-vignette"'], "value": "1"}) == 1.0
    )
    xcu = write(
        tmp_path / "registrymodifications.xcu",
        '<?xml version="1.0"?><oor:items xmlns:oor="http://openoffice.org/2001/registry">'
        '<item oor:path="/org.openoffice.Office.Impress/Misc/Start"><prop oor:name="EnablePresenterScreen" '
        'oor:op="fuse"><value>false</value></prop></item>'
        '<item oor:path="/org.openoffice.Office.Common/Save/Document"><prop oor:name="AutoSaveTimeIntervall" '
        'oor:op="fuse"><value>3</value></prop></item>'
        '<item oor:path="/org.openoffice.Office.Writer/DefaultFont"><prop oor:name="Standard" oor:op="fuse">'
        '<value>Times New Roman</value></prop></item>'
        "</oor:items>",
    )
    assert M["check_presenter_console_disable"](xcu) == 1.0
    assert (
        M["check_auto_saving_time"](xcu, {"minutes": 3}) == 1.0
        and M["check_auto_saving_time"](xcu, {"minutes": 5}) == 0.0
    )
    assert M["find_default_font"](xcu, {"font_name": "Times New Roman"}) == 1.0
    empty = write(tmp_path / "empty.xcu", '<oor:items xmlns:oor="http://openoffice.org/2001/registry"/>')
    assert (
        M["check_presenter_console_disable"](empty) == 0.0
        and M["find_default_font"](empty, {"font_name": "x"}) == 0.0
    )


def test_thunderbird_prefs_and_filters(tmp_path):
    prefs = write(
        tmp_path / "prefs.js",
        'user_pref("mail.identity.id1.auto_quote", false);\nuser_pref("mail.identity.id1.htmlSigText", '
        '"Anonym\\nXYZ Lab");\n',
    )
    rule = {"expect": {"mail.identity.id1.auto_quote": {"method": "eq", "ref": False},
                       "mail.identity.id1.htmlSigText": {"method": "re.S",
                                                         "ref": "Anonym.+XYZ Lab"}}}  # fmt: skip
    assert M["check_thunderbird_prefs"](prefs, rule) == 1.0
    assert (
        M["check_thunderbird_prefs"](prefs, {"expect": {"mail.missing": {"method": "eq", "ref": 1}}}) == 0.0
    )
    assert (
        M["check_thunderbird_prefs"](
            prefs, {"unexpect": {"mail.identity.id1.auto_quote": {"method": "eq", "ref": False}}}
        )
        == 0.0
    )
    filters = write(
        tmp_path / "msgFilterRules.dat",
        'version="9"\nlogging="no"\nname="Promo"\nenabled="yes"\ntype="17"\naction="Move to folder"\n'
        'actionValue="mailbox://nobody@Local%20Folders/Promotions"\n'
        'condition="AND (subject,contains,discount)"\n',
    )
    want = {"expect": [{"enabled": "yes", "action": "Move to folder", "actionValue": "mailbox://nobody@Local%20Folders/Promotions",
                        "condition": ["AND (subject,contains,discount)"]}]}  # fmt: skip
    assert M["check_thunderbird_filter"](filters, want) == 1.0
    want["expect"][0]["condition"] = ["ALL"]
    assert M["check_thunderbird_filter"](filters, want) == 0.0


def test_vlc_settings_and_status(tmp_path):
    vlcrc = write(
        tmp_path / "vlcrc",
        "#qt-bgcone=1\nqt-bgcone=0\n#qt-max-volume=125\ninput-record-path=/home/user/Desktop\nglobal-key-play-pause=\nqt-slider-colours=10;10;10;20;20;20\n",
    )
    assert M["check_qt_bgcone"](vlcrc, {"expected_qt_bgcone": 0}) == 1.0
    assert M["check_qt_max_volume"](vlcrc, {"expected_qt_max_volume": 200}) == 0.0
    assert M["check_qt_minimal_view"](vlcrc, {"expected_qt_minimal_view": 0}) == 1.0  # the default
    assert M["is_vlc_recordings_folder"](vlcrc, {"recording_file_path": "/home/user/Desktop"}) == 1.0
    assert M["check_global_key_play_pause"](vlcrc, {"expected_global_key_play_pause": 0}) == 1.0
    assert M["check_qt_slider_colours"](vlcrc, {"type": "blackish"}) == 1.0
    status = write(
        tmp_path / "status.xml",
        '<root><state>playing</state><information><category name="meta">'
        '<info name="filename">Never Gonna Give You Up.mp4</info></category></information></root>',
    )
    assert (
        M["is_vlc_playing"](status, {"type": "file_name", "file_name": "Never Gonna Give You Up.mp4"}) == 1.0
    )
    assert M["is_vlc_playing"](status, {"type": "file_name", "file_name": "other.mp4"}) == 0.0
    paused = write(tmp_path / "paused.xml", "<root><state>paused</state></root>")
    assert M["is_vlc_playing"](paused, {"type": "file_name", "file_name": "x"}) == 0.0
    assert M["is_vlc_fullscreen"]({"width": 1920, "height": 1080}, {"width": 1920, "height": 1080}) == 1.0

"""Writing ``--out`` files: text and pictures, and one ``out`` error naming the file when the
file system refuses."""

from __future__ import annotations

import pytest

from meshplan.outfile import write_text
from meshplan.errors import InputError
from meshplan.pyplot import pyplot, save_figure


def test_write_text_writes_utf8(tmp_path):
    path = tmp_path / "a.svg"
    write_text(path, "<svg>µs → ±</svg>\n")
    assert path.read_bytes() == "<svg>µs → ±</svg>\n".encode("utf-8")


def test_write_text_names_the_file_it_cannot_write(tmp_path):
    path = tmp_path / "gone" / "a.svg"
    with pytest.raises(InputError) as err:
        write_text(path, "x")
    assert err.value.field == "out" and str(err.value) == f"out: cannot write '{path}': No such file or directory"
    with pytest.raises(InputError, match=r"^out: cannot write '~/as typed\.svg': "):
        write_text(path, "x", "~/as typed.svg")  # named as the user wrote it
    assert not path.parent.exists()


def test_save_figure_writes_and_closes(tmp_path):
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = tmp_path / "f.png"
    save_figure(plt, fig, path, dpi=50, format="png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)


def test_save_figure_error_still_closes(tmp_path):
    plt = pyplot()
    fig, _ = plt.subplots()
    path = tmp_path / "gone" / "f.svg"
    with pytest.raises(InputError) as err:
        save_figure(plt, fig, path)
    assert err.value.field == "out" and f"cannot write '{path}'" in str(err.value)
    assert not plt.fignum_exists(fig.number)


# ---- the checks before work, and the atomic write ---------------------------------------------------

from meshplan.outfile import out_path, write_file  # noqa: E402


def test_a_file_that_appears_meanwhile_is_not_overwritten(tmp_path):
    path = out_path(str(tmp_path / "a.svg"), (".svg", ".png"))
    path.write_text("theirs")  # made while meshplan computed
    with pytest.raises(InputError, match=r"^out: '.*a\.svg' appeared while meshplan worked"):
        write_text(path, "mine")
    assert path.read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["a.svg"]  # no temporary file left behind


def test_replace_swaps_the_name_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text("old")
    write_text(out_path(str(path), force=True), "new", replace=True)
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["cfg.json"]


@pytest.mark.parametrize("force", [None, False, True])
def test_links_are_never_written_through(tmp_path, force):
    target = tmp_path / "elsewhere.json"
    link = tmp_path / "o.json"
    link.symlink_to(target)  # dangling
    with pytest.raises(InputError, match="is a symbolic link"):
        out_path(str(link), force=force)
    with pytest.raises(InputError, match="appeared while meshplan worked"):
        write_text(link, "x")  # a link made after the check: the hard link refuses it too
    assert not target.exists()


def test_names_the_file_system_cannot_hold(tmp_path):
    with pytest.raises(InputError, match=r"^out: a name in .* is 304 bytes; the file system holds at most \d+$"):
        out_path(str(tmp_path / ("a" * 300 + ".svg")), (".svg", ".png"))
    with pytest.raises(InputError, match="^out: must not contain a NUL character$"):
        out_path(str(tmp_path / "a\0.svg"))
    with pytest.raises(InputError, match="^out: must name a file"):
        out_path(" ")


def test_existing_files_need_force(tmp_path):
    path = tmp_path / "x.sh"
    path.write_text("")
    with pytest.raises(InputError, match="already exists; meshplan does not overwrite files: choose another name$"):
        out_path(str(path))
    with pytest.raises(InputError, match="already exists; meshplan does not overwrite files: pass --force to overwrite it$"):
        out_path(str(path), force=False)
    assert out_path(str(path), force=True) == path


def test_a_failed_write_leaves_nothing(tmp_path):
    def boom(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(InputError, match=r"^out: cannot write '.*b\.svg': No space left on device$"):
        write_file(tmp_path / "b.svg", boom)
    assert list(tmp_path.iterdir()) == []

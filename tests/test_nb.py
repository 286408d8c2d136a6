"""preln.nb.glue: myst-nb's glue where the book's toolchain is installed, a plain display without it."""
import pytest

from preln import nb


def test_is_myst_nb_glue_in_the_book_environment():
    myst_nb = pytest.importorskip("myst_nb", reason="myst-nb is the book's build stack (requirements.txt)")
    assert nb.HAVE_MYST_NB and nb._myst_glue is myst_nb.glue


def test_falls_back_to_showing_the_value(monkeypatch, capsys):
    monkeypatch.setattr(nb, "_myst_glue", None)
    nb.glue("ratio", 1.25, display=False)
    nb.glue("name", "int8")
    assert capsys.readouterr().out == "ratio = 1.25\nname = 'int8'\n"


def test_name_must_be_a_string():
    with pytest.raises(TypeError, match="name: expected a non-empty string"):
        nb.glue(3, 1.0)

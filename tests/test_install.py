"""tests/uv_install.py: uv is handed the settings pip is configured with, as pip would take them."""

from uv_install import pip_config, uv_arguments

LISTING = """:env:.find-links='/opt/wheels'
global.find-links='/elsewhere'
global.extra-index-url='file:///a/simple\\nfile:///b/simple'
install.index-url='https://mirror/simple'
global.index-url='https://ignored/simple'
global.constraint='/etc/c.txt'
global.cert='/etc/ssl/cert.pem'
"""


def test_each_setting_comes_from_the_place_pip_takes_it_from_and_lists_give_a_flag_per_item():
    assert uv_arguments(pip_config(LISTING)) == [
        "--index-strategy", "unsafe-best-match", "--find-links", "/opt/wheels", "--index-url", "https://mirror/simple",
        "--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple", "--constraint", "/etc/c.txt"]


def test_no_index_and_no_configuration():
    assert uv_arguments(pip_config(":env:.no-index='true'\n")) == ["--index-strategy", "unsafe-best-match",
                                                                   "--no-index"]
    assert uv_arguments(pip_config("")) == ["--index-strategy", "unsafe-best-match"]

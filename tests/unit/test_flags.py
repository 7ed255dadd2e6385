"""k8s_http.ops.flags: the standard manager flags, under the application's name."""

import inspect

import pytest

from k8s_http import Manager, add_manager_flags, manager_options, new_parser
from k8s_http.ops.flags import parse_bind_address


def _parser(app="demo-operator", **kw):
    parser = new_parser(app, description="demo")
    add_manager_flags(parser, app, **kw)
    return parser


def test_the_application_name_is_the_default_lease_and_the_version_line(capsys):
    args = _parser().parse_args([])
    assert args.leader_election_id == "demo-operator"
    with pytest.raises(SystemExit) as done:
        _parser(version="9.9").parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("demo-operator 9.9 ")


def test_no_version_flag_unless_a_version_is_given(capsys):
    with pytest.raises(SystemExit) as done:
        _parser().parse_args(["--version"])
    assert done.value.code == 2
    assert "unrecognized" in capsys.readouterr().err


def test_manager_options_are_manager_keyword_arguments():
    options = manager_options(_parser().parse_args(["--qps", "5", "--namespace", "a"]))
    params = inspect.signature(Manager).parameters
    assert set(options) <= set(params), set(options) - set(params)
    assert options["qps"] == 5.0 and options["namespaces"] == ["a"]
    assert options["graceful_shutdown_timeout_seconds"] == 25.0


def test_a_bad_value_is_one_line_naming_the_flag_and_exit_2(capsys):
    with pytest.raises(SystemExit) as done:
        _parser().parse_args(["--metrics-bind-address", "8080"])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("demo-operator: error:")
    assert "--metrics-bind-address" in err[0]


@pytest.mark.parametrize("text", ["[::zz]:80", "bad_host:80", "8080", ":70000"])
def test_the_value_parser_names_the_value_not_a_flag(text):
    with pytest.raises(ValueError, match="bind address") as err:
        parse_bind_address(text)
    assert "--" not in str(err.value)


def test_the_manager_names_the_application_in_its_user_agent():
    from k8s_http import ClusterConfig
    mgr = Manager(ClusterConfig(server="http://127.0.0.1:9"), "demo-operator",
                  metrics_bind_address="0", health_probe_bind_address="0")
    assert mgr.client.transport.user_agent == "demo-operator/0.1 (python; k8s_http)"


def test_the_settings_library_messages_name_are_flags_of_add_manager_flags():
    """with_flag_names renames only what the flags really set: each setting is a
    load_config or Manager argument, and add_manager_flags' flag stores into it."""
    from k8s_http import load_config
    from k8s_http.ops.flags import SETTING_FLAGS
    parser = _parser()
    dests = {a.option_strings[0]: a.dest for a in parser._actions if a.option_strings}
    arguments = (set(inspect.signature(load_config).parameters)
                 | set(inspect.signature(Manager).parameters))
    for name, flag in SETTING_FLAGS.items():
        assert dests[flag] == name and name in arguments, (name, flag)


def test_a_message_names_the_argument_or_with_flag_names_the_flag():
    from k8s_http import ConfigError, with_flag_names
    from k8s_http.config.configerror import setting
    err = ConfigError(setting("metrics_cert_dir"), f"needs {setting('metrics_secure')}",
                      f"set {setting('metrics_secure')} or {setting('other')}")
    assert str(err) == ("metrics_cert_dir=: needs metrics_secure=; set metrics_secure= or "
                        "other=")
    shown = with_flag_names(err)
    assert str(shown) == ("--metrics-cert-dir: needs --metrics-secure; set --metrics-secure or "
                          "other=")
    assert str(err).startswith("metrics_cert_dir=")          # the original is unchanged
    assert type(shown) is ConfigError and shown.args == err.args


"""The command line of a `Config` (`Config.with_args`, `Config.args_help`): options
parsed argparse style onto a config's fields, the `--help` text, and the messages of
invalid values that name the field and the option setting it."""

from ember.config_cli.help_text import _help
from ember.config_cli.messages import _describe, _unknown
from ember.config_cli.options import _parse_args
from ember.config_cli.values import _model_values

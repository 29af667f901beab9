"""What is trained: the job spec every worker gets at Join, the built-in models and datasets (and
how a name or a ``package.module:function`` path resolves to a factory), the ranges of their options
and their size estimated before they are built, and how a job ended (its reasons and the exit statuses
they give). May import common.transport (the model's flat layout), common.errors and
common.number_checks."""

"""What is trained: the job spec every worker gets at Join, the built-in models and datasets (and
how a name or a ``package.module:function`` path resolves to a factory), and the test-split
evaluation of the global model. Shared by the server and the workers. May import ps.transport (the
model's flat layout), ps.errors and ps.number_checks."""

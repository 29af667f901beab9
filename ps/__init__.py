"""The parameter server, in folders by concern. Each folder's __init__.py says what it holds and what
it may import; tests/test_layout.py checks that every import follows the arrows:

    server.py, servicer.py   the ps-server CLI (its flags: server_flags.py) and its thin gRPC servicer
            |
         rounds/ -----> control/    the coordinator; batch sizing (pure: no torch, gRPC or I/O)
            |
         shards/                    --shards: a range of the parameters on a server of its own
            |
         params/                    the global parameters: store, stepping, aggregation, checkpoints
            |
          job/                      what is trained: spec, models, datasets, evaluation
            |
        transport/ --> protos/      the wire format and the gRPC plumbing, no core logic

A part may import every part below it, never one above. ops/ (metrics log, memory, port file, flag
types) imports nothing of ps; shards/, rounds/, the server and the workers use it. errors.py and
number_checks.py are leaves that import nothing of the project. worker/ uses job/, transport/,
params/ and ops/, never rounds/, control/, shards/ or the server.
"""

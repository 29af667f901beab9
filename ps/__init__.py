"""The parameter server, in folders by concern. It stands on common/ (the job, the wire, the flat
parameters) beside worker/, and neither imports the other. Each folder's __init__.py says what it
holds and what it may import; tests/test_layout.py checks that every import follows the arrows:

    server.py, servicer.py   the ps-server CLI (its flags: server_flags.py, checked against each other
                             in flag_checks.py; its job built from them: server_job.py, and served:
                             server_run.py) and its thin gRPC servicer
            |
         rounds/ -----> control/    the coordinator; batch sizing (pure: no torch, gRPC or I/O)
            |
         shards/                    --shards: a range of the parameters on a server of its own
            |
         serving/                   the server's side of gRPC: handlers, push streams, secrets, blobs
            |
       checkpoint.py                checkpoint files of the server's whole state
            |
         common/                    the job, the flat parameters, the wire (shared with worker/)

A part may import every part below it, never one above. ops/ (metrics log, health, Prometheus,
progress bar and lines, the port file) imports only common/.
"""

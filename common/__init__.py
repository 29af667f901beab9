"""What the server and the workers share, in folders by concern. Neither side's code lives here and
nothing here imports ps/ or worker/; tests/test_layout.py checks the arrows:

         job/                       what is trained: spec, models, datasets
          |
        params/                     the flat parameters: store, stepping, aggregation, optimizer state
          |
      transport/ --> protos/        the wire format, the messages both sides exchange, gRPC plumbing

A part may import every part below it, never one above. ops/ (flag types, malloc tuning, stack
dumps) imports nothing of the project; errors.py and number_checks.py are leaves.
"""

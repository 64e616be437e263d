"""A stand-in for opencode 2.x (`stand_in.StandIn`), built from its source: 2.x does not install here."""

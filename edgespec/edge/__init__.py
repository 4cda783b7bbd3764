"""Edge concerns, consulted by the engine's builder only: device profiles, execution providers, the
memory plan, the power governor and its sensors, and `doctor`."""

"""Layer 2: shapes and index math (symbolic expressions, View, ShapeTracker). Imports only tinyc.helpers and the stdlib."""

"""The project's data models, importable from every layer: the offline corpus and its grounded
questions (with their answer judge), and the workload trace model."""

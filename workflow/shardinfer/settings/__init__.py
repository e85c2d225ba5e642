"""The config as data: the schema (the one home of every key's default), a task's config section as a
typed, frozen object, and the settings every rule's code takes as frozen dataclasses. Imports only
`core`."""

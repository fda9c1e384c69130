"""The database: engines, tables, migrations and one repository module per table."""

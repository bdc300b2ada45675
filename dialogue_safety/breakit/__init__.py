"""Build it / break it / fix it: people attack the deployed model, validated attacks become training rounds.

``store`` owns the database (SQLAlchemy + Alembic migrations; SQLite WAL by default, PostgreSQL by
URL), ``game`` the rules of a task, ``api`` the JSON API and the page (mounted by the service only
when ``SAFETY_BREAKIT_DB`` is set), ``pool`` the contexts a round draws from, ``export`` the dataset
source written from validated attacks (the ``breakit`` source of :mod:`dialogue_safety.sources`).
"""

"""The Django app the django-fsm case defines its model in (imported by Django itself)."""

from django.apps import AppConfig

APP_LABEL = "lifecycle_bench"


class BenchConfig(AppConfig):
    name = "benchmarks.django_app"
    label = APP_LABEL
    default_auto_field = "django.db.models.BigAutoField"

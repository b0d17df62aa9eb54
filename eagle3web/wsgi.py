import os

from django.conf import settings
from django.core.wsgi import get_wsgi_application

from eagle3web.gc_freeze import FreezeAfterWarmup

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eagle3web.settings")
application = FreezeAfterWarmup(get_wsgi_application(), requests=settings.EAGLE3WEB_GC_FREEZE_AFTER_REQUESTS,
                                static_prefix=settings.STATIC_URL)

import sys

from preln.parallel.distributed import main

sys.exit(main())

from seqmix.cli import main

raise SystemExit(main())

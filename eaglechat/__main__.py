from eaglechat.cli import main

raise SystemExit(main())

from . import main

if __name__ == "__main__":  # python -m gieok.cli
    main()
